// rootclad/ops/loss.h — the losses, mean over the batch, and their event-weighted form.
#ifndef ROOTCLAD_OPS_LOSS_H
#define ROOTCLAD_OPS_LOSS_H

#include "core.h"

namespace rootclad {

// ---------------------------------------------------------------------------------------
// Losses, mean over the batch. Each returns the loss; its backward adds d_loss * dL/dinput.
//
// bce_with_logits: L = mean_i [ max(z,0) - z*y + log(1 + exp(-|z|)) ]  (stable form)
template <typename T> T bce_with_logits_forward(const T* logits, const T* target, int N);

// dL/dz_i = (sigmoid(z_i) - y_i) / N
template <typename T>
void bce_with_logits_backward(T* d_logits, T d_loss, const T* logits, const T* target, int N);

// mse: L = mean_i (x_i - y_i)^2;  dL/dx_i = 2 (x_i - y_i) / N
template <typename T> T mse_forward(const T* inp, const T* target, int N);

template <typename T> void mse_backward(T* d_inp, T d_loss, const T* inp, const T* target, int N);

// cross_entropy over logits(B, NC) with class indices target(B) (stored as T):
//   L = mean_b [ logsumexp(logits_b) - logits_b[target_b] ]
// The stable softmax denominator of one row: m = max_c z[c], returns sum_c exp(z[c] - m).
template <typename T> T cross_entropy_forward(const T* logits, const T* target, int B, int NC);

// dL/dz_bc = (softmax(z_b)_c - [c == target_b]) / B
template <typename T>
void cross_entropy_backward(T* d_logits, T d_loss, const T* logits, const T* target, int B, int NC);

// nll over log-probabilities logp(B, NC) (after LogSoftmax) with class indices target(B):
//   L = -mean_b logp_b[target_b];  dL/dlogp_bc = -[c == target_b] / B
template <typename T> T nll_forward(const T* logp, const T* target, int B, int NC);

template <typename T>
void nll_backward(T* d_logp, T d_loss, const T* logp, const T* target, int B, int NC);

// huber (torch's delta = 1): l(d) = d^2 / 2 where |d| < 1, else |d| - 1/2; d = x - y; mean.
template <typename T> T huber_forward(const T* inp, const T* target, int N);

template <typename T> void huber_backward(T* d_inp, T d_loss, const T* inp, const T* target, int N);

// ---------------------------------------------------------------------------------------
// Per-sample weights (HEP event weights): the loss is the mean over all N = Bf * K elements of
// w_b * l(z_bk, y_bk) (cross_entropy: over the Bf samples of w_b * l_b), so that
// F.<loss>(z, y, reduction="none") weighted the same way and averaged gives the same number;
// weights of 1 give the unweighted loss. For rows [0, B) of a batch of Bf samples (z, y, w and
// d_z point at the chunk's first row), the loss reads the K outputs at columns [col, col + K)
// of rows of ld (a model with several outputs concatenates them per sample, and the loss
// takes one; a model with one has col 0 and ld K). Returns the chunk's share and, unless d_z
// is null, writes (not adds) whole rows of d_z = dL/dz, 0 outside the loss's columns. w null:
// every weight 1. kind: 0 bce_with_logits, 1 mse, 2 cross_entropy, 3 nll, 4 huber.
template <typename T>
T column_loss(int kind, const T* z, const T* y, const T* w, T* d_z, int Bf, int B, int col, int K,
              int ld);

// A model with one output: every column of each row.
template <typename T>
T weighted_loss(int kind, const T* z, const T* y, const T* w, T* d_z, int Bf, int B, int K);

} // namespace rootclad

// Clad-convention pullbacks (core.h says how they are written).
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void bce_with_logits_forward_pullback(const T* logits, const T* target, int N, T d_loss,
                                      T* d_logits, int* d_N) {
  ::rootclad::bce_with_logits_backward(d_logits, d_loss, logits, target, N);
}

template <typename T>
void mse_forward_pullback(const T* inp, const T* target, int N, T d_loss, T* d_inp, int* d_N) {
  ::rootclad::mse_backward(d_inp, d_loss, inp, target, N);
}

template <typename T>
void cross_entropy_forward_pullback(const T* logits, const T* target, int B, int NC, T d_loss,
                                    T* d_logits, int* d_B, int* d_NC) {
  ::rootclad::cross_entropy_backward(d_logits, d_loss, logits, target, B, NC);
}

template <typename T>
void nll_forward_pullback(const T* logp, const T* target, int B, int NC, T d_loss, T* d_logp,
                          int* d_B, int* d_NC) {
  ::rootclad::nll_backward(d_logp, d_loss, logp, target, B, NC);
}

template <typename T>
void huber_forward_pullback(const T* inp, const T* target, int N, T d_loss, T* d_inp, int* d_N) {
  ::rootclad::huber_backward(d_inp, d_loss, inp, target, N);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "loss_impl.h"
#endif

#endif // ROOTCLAD_OPS_LOSS_H
