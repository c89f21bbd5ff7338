// rootclad/ops/shape.h — permute, cat, slice, pad, expand, a parameter read directly, and topk's
// indices and the gather by them.
#ifndef ROOTCLAD_OPS_SHAPE_H
#define ROOTCLAD_OPS_SHAPE_H

#include "core.h"

namespace rootclad {

// Permute the per-sample axes: out[b, i0, i1, i2, i3] = inp[b*N + i0*s0 + i1*s1 + i2*s2 +
// i3*s3], (n0..n3) the output's axes (padded with 1s), s0..s3 their strides in the input.
template <typename T>
void permute_forward(T* out, const T* inp, int B, int N, int n0, int n1, int n2, int n3, int s0,
                     int s1, int s2, int s3);

template <typename T>
void permute_backward(T* d_inp, const T* d_out, int B, int N, int n0, int n1, int n2, int n3,
                      int s0, int s1, int s2, int s3);

// ---------------------------------------------------------------------------------------
// Concatenation, one input at a time: row r of inp (n_in values) goes to columns
// [off, off + n_in) of row r of out (n_out values). R = B * (the axes before the cat axis).
template <typename T>
void cat_part_forward(T* out, const T* inp, int R, int n_in, int n_out, int off);

template <typename T>
void cat_part_backward(T* d_inp, const T* d_out, int R, int n_in, int n_out, int off);

// ---------------------------------------------------------------------------------------
// A slice along one axis: inp(R, N, I) -> out(R, M, I), out[r, m, i] = inp[r, start + m*step, i]
// (R = B * the axes before the sliced one, I the values after it): x[:, a:b:s], chunk, split.
template <typename T>
void slice_forward(T* out, const T* inp, int R, int N, int M, int I, int start, int step);

template <typename T>
void slice_backward(T* d_inp, const T* d_out, int R, int N, int M, int I, int start, int step);

// ---------------------------------------------------------------------------------------
// Constant padding along one axis, the adjoint of a slice of step 1: inp(R, M, I) -> out(R, N, I),
// out[r, before + m, i] = inp[r, m, i] and value elsewhere (F.pad and ONNX Pad in constant mode,
// Swin's windows over a map that is not a multiple of them).
template <typename T>
void pad_forward(T* out, const T* inp, int R, int M, int N, int I, int before, T value);

template <typename T>
void pad_backward(T* d_inp, const T* d_out, int R, int M, int N, int I, int before);

// ---------------------------------------------------------------------------------------
// A parameter the model reads directly (a layer scale, a class token, a position embedding):
// out(B, n) = w(n) for every sample; its gradient sums over the batch.
template <typename T> void parameter_forward(T* out, const T* w, int B, int n);

template <typename T> void parameter_backward(T* d_w, const T* d_out, int B, int n);

// ---------------------------------------------------------------------------------------
// expand: out(B, d0, d1, d2) = inp[b*n + i0*s0 + i1*s1 + i2*s2] (n values a sample; stride 0
// on an axis that grows from 1); the backward sums over the copies.
template <typename T>
void expand_forward(T* out, const T* inp, int B, int n, int d0, int d1, int d2, int s0, int s1,
                    int s2);

template <typename T>
void expand_backward(T* d_inp, const T* d_out, int B, int n, int d0, int d1, int d2, int s0, int s1,
                     int s2);

// ---------------------------------------------------------------------------------------
// topk's indices: x(R, N, Q) -> out(R, K, Q), the indices along N of the K largest (or
// smallest) of each row, sorted, as exact integers (topk_select.h). No gradient.
template <typename T>
void topk_forward(T* out, const T* x, int R, int N, int K, int Q, int largest);

// gather: x(R, N, Q), index / out(R, M, Q): out[r, m, q] = x[r, idx[r, m, q], q]; an index
// outside [0, N) or NaN gives NaN, never a read outside x. The backward adds into the
// gathered places (twice where gathered twice); the indices get no gradient.
template <typename T>
void gather_forward(T* out, const T* x, const T* idx, int R, int N, int M, int Q);

template <typename T>
void gather_backward(T* d_x, const T* d_out, const T* idx, int R, int N, int M, int Q);

} // namespace rootclad

// topk's and gather's pullbacks stay when Clad differentiates the kernels themselves: topk's
// indices carry no gradient (Clad's derivative of the selection would be zero, at the cost of
// a sort), and Clad's derivative of gather's loop failed at run time (its tape of the bound
// checks ran empty).
namespace clad {
namespace custom_derivatives {
namespace rootclad {
template <typename T>
void topk_forward_pullback(T* out, const T* x, int R, int N, int K, int Q, int largest, T* d_out,
                           T* d_x, int*, int*, int*, int*, int*) {}

template <typename T>
void gather_forward_pullback(T* out, const T* x, const T* idx, int R, int N, int M, int Q, T* d_out,
                             T* d_x, T* d_idx, int*, int*, int*, int*) {
  ::rootclad::gather_backward(d_x, d_out, idx, R, N, M, Q);
}
} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad

// Clad-convention pullbacks (core.h says how they are written).
#ifndef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void permute_forward_pullback(T* out, const T* inp, int B, int N, int n0, int n1, int n2, int n3,
                              int s0, int s1, int s2, int s3, T* d_out, T* d_inp, int*, int*, int*,
                              int*, int*, int*, int*, int*, int*, int*) {
  ::rootclad::permute_backward(d_inp, d_out, B, N, n0, n1, n2, n3, s0, s1, s2, s3);
}

template <typename T>
void cat_part_forward_pullback(T* out, const T* inp, int R, int n_in, int n_out, int off, T* d_out,
                               T* d_inp, int* d_R, int* d_n_in, int* d_n_out, int* d_off) {
  ::rootclad::cat_part_backward(d_inp, d_out, R, n_in, n_out, off);
}

template <typename T>
void slice_forward_pullback(T* out, const T* inp, int R, int N, int M, int I, int start, int step,
                            T* d_out, T* d_inp, int*, int*, int*, int*, int*, int*) {
  ::rootclad::slice_backward(d_inp, d_out, R, N, M, I, start, step);
}

template <typename T>
void pad_forward_pullback(T* out, const T* inp, int R, int M, int N, int I, int before, T value,
                          T* d_out, T* d_inp, int*, int*, int*, int*, int*, T*) {
  ::rootclad::pad_backward(d_inp, d_out, R, M, N, I, before);
}

template <typename T>
void expand_forward_pullback(T* out, const T* inp, int B, int n, int d0, int d1, int d2, int s0,
                             int s1, int s2, T* d_out, T* d_inp, int*, int*, int*, int*, int*, int*,
                             int*, int*) {
  ::rootclad::expand_backward(d_inp, d_out, B, n, d0, d1, d2, s0, s1, s2);
}

template <typename T>
void parameter_forward_pullback(T* out, const T* w, int B, int n, T* d_out, T* d_w, int*, int*) {
  ::rootclad::parameter_backward(d_w, d_out, B, n);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
#endif

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "shape_impl.h"
#endif

#endif // ROOTCLAD_OPS_SHAPE_H
