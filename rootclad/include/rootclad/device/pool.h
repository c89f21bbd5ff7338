// rootclad/device/pool.h — pooling over windows and over all positions as device kernels
// (device_kernels.h says how they are written).
#ifndef ROOTCLAD_DEVICE_POOL_H
#define ROOTCLAD_DEVICE_POOL_H

#include "../ops/pool_geometry.h"
#include "core.h"

namespace rootclad {
namespace dev {

// -- pooling over windows of inp(R, H, W) -> out(R, OH, OW) (1-D: H = KH = 1); padding at most
// half the window, and a ceil_mode window starts inside the input or its left padding, so every
// window holds an input element (pool_geometry.h) -------------------------------------------------
struct Pool {
  int H, W, KH, KW, SH, SW, PH, PW, OH, OW;
};

inline Pool pool2d_shape(int H, int W, int KH, int KW, int SH, int SW, int PH, int PW,
                         int ceil_mode = 0) {
  return Pool{H,
              W,
              KH,
              KW,
              SH,
              SW,
              PH,
              PW,
              pool_out(H, KH, SH, PH, ceil_mode),
              pool_out(W, KW, SW, PW, ceil_mode)};
}

// MaxPool: out = act(the window's first maximum), which takes the window's gradient, as in
// torch
template <class On, class T, class Act = NoAct>
void maxpool2d_forward(On on, T* out, const T* inp, long R, Pool p, Act act = {});

template <class On, class T, class DY>
void maxpool2d_backward(On on, T* d_inp, DY d_out, const T* inp, long R, Pool p);

// AvgPool: out = act(the window's mean); with count_include_pad (torch's default) a window
// divides by KH*KW (less what a ceil_mode window runs past the padding), otherwise by its
// elements inside the input
template <class On, class T, class Act = NoAct>
void avgpool2d_forward(On on, T* out, const T* inp, long R, Pool p, int count_include_pad,
                       Act act = {});

template <class On, class T, class DY>
void avgpool2d_backward(On on, T* d_inp, DY d_out, long R, Pool p, int count_include_pad);

// -- adaptive pooling of inp(R, H, W) -> out(R, OH, OW) (1-D: H = OH = 1), windows by
// adaptive_start/adaptive_end (ops/pool_geometry.h) ---------------------------------------------
struct Adaptive {
  int H, W, OH, OW;
};

template <class On, class T>
void adaptive_maxpool_forward(On on, T* out, const T* inp, long R, Adaptive a);

template <class On, class T>
void adaptive_avgpool_forward(On on, T* out, const T* inp, long R, Adaptive a);

// the backward gathered: each input position adds the share of every window that holds it
template <class On, class T>
void adaptive_pool_backward(On on, T* d_inp, const T* d_out, const T* inp, long R, Adaptive a,
                            int is_max);

// -- global max pooling: out(R) = the maximum of each row of inp(R, L); its first maximum
// takes the gradient (as MaxPool's windows) ----------------------------------------------------
template <class On, class T>
void global_maxpool_forward(On on, T* out, const T* inp, long R, int L);

// one index per row, which adds into one element of its own row
template <class On, class T>
void global_maxpool_backward(On on, T* d_inp, const T* d_out, const T* inp, long R, int L);

// -- amax over each row of inp(R, L): out(R) the maximum (NaN where the row holds one); the
// backward shares a row's gradient as torch's (amax_row, pool_geometry.h) --------------------
template <class On, class T> void amax_forward(On on, T* out, const T* inp, long R, int L);

// one index per row, which adds into its own row only
template <class On, class T>
void amax_backward(On on, T* d_inp, const T* d_out, const T* inp, long R, int L);

// -- global average pooling: out(R) = the mean of each row of inp(R, L) ---------------------
template <class On, class T>
void global_avgpool_forward(On on, T* out, const T* inp, long R, int L);

template <class On, class T>
void global_avgpool_backward(On on, T* d_inp, const T* d_out, long R, int L);

// -- upsampling inp(R, H, W) -> out(R, OH, OW) (1-D: H = OH = 1), nearest or linear along each
// axis as torch's (upsample_i0 / upsample_lambda, ops/pool_geometry.h) -------------------------
template <class T> struct Upsample {
  int H, W, OH, OW, mode;
  T sh, sw;
};

template <class On, class T>
void upsample_forward(On on, T* out, const T* inp, long R, Upsample<T> u);

// the backward gathered: each input position adds the weighted gradients of its readers
template <class On, class T>
void upsample_backward(On on, T* d_inp, const T* d_out, long R, Upsample<T> u);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "pool_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_POOL_H
