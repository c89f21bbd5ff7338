// rootclad/device/shape.h — permute, cat, slice, pad, expand, topk's indices and gather as device
// kernels (device_kernels.h says how they are written).
#ifndef ROOTCLAD_DEVICE_SHAPE_H
#define ROOTCLAD_DEVICE_SHAPE_H

#include "../ops/topk_select.h"
#include "core.h"

namespace rootclad {
namespace dev {

// -- permute: per sample, out's element j = (j0..j3) over dims reads inp at sum j_k st[k] -------
struct Permute {
  int dims[4], st[4];
  long n; // values per sample
};

template <class On, class T> void permute_forward(On on, T* out, const T* inp, long B, Permute g);

// a permutation: every input element is read once, so the scatter writes each place once
template <class On, class T>
void permute_backward(On on, T* d_inp, const T* d_out, long B, Permute g);

// -- cat: input part inp(R, n_in) goes to columns [off, off + n_in) of out(R, n_out) ----------
template <class On, class T>
void cat_part_forward(On on, T* out, const T* inp, long R, int n_in, int n_out, int off);

template <class On, class T>
void cat_part_backward(On on, T* d_inp, const T* d_out, long R, int n_in, int n_out, int off);

// -- slice: inp(R, N, I) -> out(R, M, I), out[r, m, i] = inp[r, start + m*step, i] ------------
struct Slice {
  int N, M, I, start, step;
};

template <class On, class T> void slice_forward(On on, T* out, const T* inp, long R, Slice g);

// distinct outputs read distinct inputs (step >= 1): the scatter writes each place once
template <class On, class T> void slice_backward(On on, T* d_inp, const T* d_out, long R, Slice g);

// -- pad: inp(R, M, I) -> out(R, N, I), out[r, before + m, i] = inp[r, m, i], value elsewhere --
struct Pad {
  int M, N, I, before;
};

template <class On, class T> void pad_forward(On on, T* out, const T* inp, long R, Pad g, T value);

template <class On, class T> void pad_backward(On on, T* d_inp, const T* d_out, long R, Pad g);

// -- a parameter read directly: out(B, n) = w(n) per sample; its gradient sums over the batch
template <class On, class T> void parameter_forward(On on, T* out, const T* w, long B, long n);

template <class On, class T> void parameter_backward(On on, T* d_w, const T* d_out, long B, long n);

// -- expand: out(B, d0, d1, d2) reads inp at b*n + i0*s0 + i1*s1 + i2*s2 (stride 0 where an
// axis grows from 1); the backward adds each copy's gradient into its source through add_to
struct Expand {
  int d[3], s[3];
  long n; // input values per sample
};

template <class On, class T> void expand_forward(On on, T* out, const T* inp, long B, Expand g);

template <class On, class T>
void expand_backward(On on, T* d_inp, const T* d_out, long B, Expand g);

// -- topk's indices: x(R, N, Q) -> out(R, K, Q), one thread per row (topk_select.h) ---------
template <class On, class T>
void topk_forward(On on, T* out, const T* x, long R, int N, int K, int Q, int largest);

// -- gather: x(R, N, Q), index / out(R, M, Q): out[r, m, q] = x[r, idx[r, m, q], q]; NaN for
// an index outside [0, N); the backward adds into the gathered places through add_to
template <class On, class T>
void gather_forward(On on, T* out, const T* x, const T* idx, long R, int N, int M, int Q);

template <class On, class T>
void gather_backward(On on, T* d_x, const T* d_out, const T* idx, long R, int N, int M, int Q);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "shape_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_SHAPE_H
