// rootclad/ops/elementwise.h — every elementwise op through its functor (activations.h), and
// Dropout.
#pragma once

#include "../dropout_mask.h"
#include "activations.h"
#include "core.h"

namespace rootclad {

// ---------------------------------------------------------------------------------------
// Elementwise ops over N elements: the functor's value and derivative (ops/activations.h).
// out[i] = f(inp[i])
template <typename T, class F> void unary_forward(T* out, const T* inp, int N, F f) {
  ROOTCLAD_REPLAY_SKIP;
  for (int i = 0; i < N; ++i)
    out[i] = f.f(inp[i]);
}
// d_inp[i] += the functor's grad: d_out[i] times f'(inp[i]), from the input or the output
template <typename T, class F>
void unary_backward(T* d_inp, const T* d_out, const T* inp, const T* out, int N, F f) {
  for (int i = 0; i < N; ++i)
    d_inp[i] += f.grad(d_out[i], inp[i], out[i]);
}

// ---------------------------------------------------------------------------------------
// Dropout (training): the mask is dropout_mask.h's, recomputed by the backward pass.
template <typename T>
void dropout_forward(T* out, const T* inp, int N, T p, std::uint64_t seed, long i0) {
  ROOTCLAD_REPLAY_SKIP;
  for (int i = 0; i < N; ++i)
    out[i] = inp[i] * dropout_scale(seed, i0 + i, p);
}
template <typename T>
void dropout_backward(T* d_inp, const T* d_out, int N, T p, std::uint64_t seed, long i0) {
  for (int i = 0; i < N; ++i)
    d_inp[i] += d_out[i] * dropout_scale(seed, i0 + i, p);
}

} // namespace rootclad

// Clad-convention pullbacks (core.h says how they are written).
#ifndef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves
namespace clad {
namespace custom_derivatives {
namespace rootclad {

// Every elementwise op (ops/activations.h): the functor's own grad. DF is whatever Clad passes
// for the functor's adjoint (the functor holds constants: nothing flows into it).
template <typename T, class F, class DF>
void unary_forward_pullback(T* out, const T* inp, int N, F f, T* d_out, T* d_inp, int* d_N, DF) {
  ::rootclad::unary_backward(d_inp, d_out, inp, out, N, f);
}

template <typename T>
void dropout_forward_pullback(T* out, const T* inp, int N, T p, ::std::uint64_t seed, long i0,
                              T* d_out, T* d_inp, int* d_N, T* d_p, ::std::uint64_t* d_seed,
                              long* d_i0) {
  ::rootclad::dropout_backward(d_inp, d_out, N, p, seed, i0);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
#endif
