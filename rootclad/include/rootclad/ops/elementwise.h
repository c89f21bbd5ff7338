// rootclad/ops/elementwise.h — every elementwise op through its functor (activations.h), and
// Dropout.
#ifndef ROOTCLAD_OPS_ELEMENTWISE_H
#define ROOTCLAD_OPS_ELEMENTWISE_H

#include "../dropout_mask.h"
#include "activations.h"
#include "core.h"

namespace rootclad {

// ---------------------------------------------------------------------------------------
// Elementwise ops over N elements: the functor's value and derivative (ops/activations.h).
// out[i] = f(inp[i])
template <typename T, class F> void unary_forward(T* out, const T* inp, int N, F f);

// d_inp[i] += the functor's grad: d_out[i] times f'(inp[i]), from the input or the output
template <typename T, class F>
void unary_backward(T* d_inp, const T* d_out, const T* inp, const T* out, int N, F f);

// ---------------------------------------------------------------------------------------
// Elementwise ops with a parameter per channel (PReLU): inp(B, C, S) and a(A), A = C (one per
// channel) or 1 (one for all); out = f(x, a[c]) (the functor's, ops/activations.h).
// Written for Clad to differentiate as it is (pullbacks=False): every index computed in place,
// no declaration or conditional inside the loops (a conditional index there crashed Clad's
// tape).
template <typename T, class F>
void parametric_forward(T* out, const T* inp, const T* a, int B, int C, int S, int A, F f);

// d_inp += the functor's grad, d_a[c] += its param_grad summed over the batch and positions
// (null d_inp or d_a: that half is skipped)
template <typename T, class F>
void parametric_backward(T* d_inp, T* d_a, const T* d_out, const T* inp, const T* out, const T* a,
                         int B, int C, int S, int A, F f);

// ---------------------------------------------------------------------------------------
// Dropout (training): the mask is dropout_mask.h's, recomputed by the backward pass.
template <typename T>
void dropout_forward(T* out, const T* inp, int N, T p, std::uint64_t seed, long i0);

template <typename T>
void dropout_backward(T* d_inp, const T* d_out, int N, T p, std::uint64_t seed, long i0);

// torch.randn_like: a standard normal draw per element (dropout_mask.h's normal_draw of its
// index in the batch, i0 + i), in training and eval alike (torch draws in either); inp gives
// the shape only, and takes no gradient.
template <typename T> void normal_forward(T* out, const T* inp, int N, std::uint64_t seed, long i0);

// Stochastic depth (training): sample r's whole value (n values) kept with probability 1 - p
// and scaled by 1 / (1 - p), or dropped; the mask is dropout_mask.h's for the sample's index
// in the batch (r0 + r), or for index 0 for every sample (whole_batch: torchvision's 'batch').
template <typename T>
void sample_dropout_forward(T* out, const T* inp, int R, int n, T p, std::uint64_t seed, long r0,
                            int whole_batch);

template <typename T>
void sample_dropout_backward(T* d_inp, const T* d_out, int R, int n, T p, std::uint64_t seed,
                             long r0, int whole_batch);

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

template <typename T, class F, class DF>
void parametric_forward_pullback(T* out, const T* inp, const T* a, int B, int C, int S, int A, F f,
                                 T* d_out, T* d_inp, T* d_a, int*, int*, int*, int*, DF) {
  ::rootclad::parametric_backward(d_inp, d_a, d_out, inp, out, a, B, C, S, A, f);
}

template <typename T>
void dropout_forward_pullback(T* out, const T* inp, int N, T p, ::std::uint64_t seed, long i0,
                              T* d_out, T* d_inp, int* d_N, T* d_p, ::std::uint64_t* d_seed,
                              long* d_i0) {
  ::rootclad::dropout_backward(d_inp, d_out, N, p, seed, i0);
}

template <typename T>
void normal_forward_pullback(T* out, const T* inp, int N, ::std::uint64_t seed, long i0, T* d_out,
                             T* d_inp, int*, ::std::uint64_t*, long*) {} // no gradient

template <typename T>
void sample_dropout_forward_pullback(T* out, const T* inp, int R, int n, T p, ::std::uint64_t seed,
                                     long r0, int whole_batch, T* d_out, T* d_inp, int*, int*, T*,
                                     ::std::uint64_t*, long*, int*) {
  ::rootclad::sample_dropout_backward(d_inp, d_out, R, n, p, seed, r0, whole_batch);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
#endif

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "elementwise_impl.h"
#endif

#endif // ROOTCLAD_OPS_ELEMENTWISE_H
