// rootclad/device/elementwise.h — the elementwise ops and Dropout as device kernels
// (device_kernels.h says how they are written).
#pragma once

#include "core.h"

namespace rootclad {
namespace dev {

// -- elementwise ops: the functors of ops/activations.h, written once for every backend; those
// whose grad reads y alone (Relu, Tanh, Sigmoid) can be fused into their producer -------------
template <class On, class T, class Op>
void unary_forward(On on, T* out, const T* inp, long n, Op op) {
  each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = op.f(inp[i]); });
}

// d_inp += the functor's grad: d_out times f'(x), from x or y
template <class On, class T, class Op>
void unary_backward(On on, T* d_inp, const T* d_out, const T* inp, const T* out, long n, Op op) {
  each_index(on, n, ROOTCLAD_BODY(long i) { d_inp[i] += op.grad(d_out[i], inp[i], out[i]); });
}

// -- Dropout: the CPU's mask (dropout_mask.h) for the element's index in the batch; p = 0 (eval
// mode) keeps every element -------------------------------------------------------------------
template <class On, class T>
void dropout_forward(On on, T* out, const T* inp, long n, T p, std::uint64_t seed) {
  each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = inp[i] * dropout_scale(seed, i, p); });
}

template <class On, class T>
void dropout_backward(On on, T* d_inp, const T* d_out, long n, T p, std::uint64_t seed) {
  each_index(on, n, ROOTCLAD_BODY(long i) { d_inp[i] += d_out[i] * dropout_scale(seed, i, p); });
}

} // namespace dev
} // namespace rootclad
