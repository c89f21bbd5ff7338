// rootclad/loss_pullbacks.h — Clad custom derivatives of the losses.
//
// Kept apart from the layers' pullbacks because the clad engine uses them in both of its
// modes: Clad's gradient call returns no value, and its reverse sweep may restore the
// activations the forward sweep wrote, so the loss value cannot be read back afterwards.
// The loss pullback runs while the logits still hold their forward values; it recomputes the
// loss there (O(batch)) and notes it in last_loss<T> for the caller.
//
// Loss targets are constants (never differentiated), and Clad's activity analysis may then
// drop their adjoint from the pullback it looks for (DESIGN.md): each loss has a pullback
// without d_target and one with it.
#pragma once

#include "kernels.h"

namespace rootclad {
template <typename T> inline thread_local T last_loss = T(0);
} // namespace rootclad

namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void bce_with_logits_forward_pullback(const T* logits, const T* target, int N, T d_loss,
                                      T* d_logits, int* d_N) {
  ::rootclad::last_loss<T> = ::rootclad::bce_with_logits_forward(logits, target, N);
  ::rootclad::bce_with_logits_backward(d_logits, d_loss, logits, target, N);
}

template <typename T>
void mse_forward_pullback(const T* inp, const T* target, int N, T d_loss, T* d_inp, int* d_N) {
  ::rootclad::last_loss<T> = ::rootclad::mse_forward(inp, target, N);
  ::rootclad::mse_backward(d_inp, d_loss, inp, target, N);
}

template <typename T>
void cross_entropy_forward_pullback(const T* logits, const T* target, int B, int NC, T d_loss,
                                    T* d_logits, int* d_B, int* d_NC) {
  ::rootclad::last_loss<T> = ::rootclad::cross_entropy_forward(logits, target, B, NC);
  ::rootclad::cross_entropy_backward(d_logits, d_loss, logits, target, B, NC);
}

template <typename T>
void nll_forward_pullback(const T* logp, const T* target, int B, int NC, T d_loss, T* d_logp,
                          int* d_B, int* d_NC) {
  ::rootclad::last_loss<T> = ::rootclad::nll_forward(logp, target, B, NC);
  ::rootclad::nll_backward(d_logp, d_loss, logp, target, B, NC);
}

template <typename T>
void huber_forward_pullback(const T* inp, const T* target, int N, T d_loss, T* d_inp, int* d_N) {
  ::rootclad::last_loss<T> = ::rootclad::huber_forward(inp, target, N);
  ::rootclad::huber_backward(d_inp, d_loss, inp, target, N);
}

// The same pullbacks with an adjoint for the targets, which Clad asks for when the target
// pointer is computed from the arguments (as in a chunk of a batch). Targets are constants:
// d_target is left untouched.
template <typename T>
void bce_with_logits_forward_pullback(const T* logits, const T* target, int N, T d_loss,
                                      T* d_logits, T* d_target, int* d_N) {
  bce_with_logits_forward_pullback(logits, target, N, d_loss, d_logits, d_N);
}

template <typename T>
void mse_forward_pullback(const T* inp, const T* target, int N, T d_loss, T* d_inp, T* d_target,
                          int* d_N) {
  mse_forward_pullback(inp, target, N, d_loss, d_inp, d_N);
}

template <typename T>
void cross_entropy_forward_pullback(const T* logits, const T* target, int B, int NC, T d_loss,
                                    T* d_logits, T* d_target, int* d_B, int* d_NC) {
  cross_entropy_forward_pullback(logits, target, B, NC, d_loss, d_logits, d_B, d_NC);
}

template <typename T>
void nll_forward_pullback(const T* logp, const T* target, int B, int NC, T d_loss, T* d_logp,
                          T* d_target, int* d_B, int* d_NC) {
  nll_forward_pullback(logp, target, B, NC, d_loss, d_logp, d_B, d_NC);
}

template <typename T>
void huber_forward_pullback(const T* inp, const T* target, int N, T d_loss, T* d_inp, T* d_target,
                            int* d_N) {
  huber_forward_pullback(inp, target, N, d_loss, d_inp, d_N);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
