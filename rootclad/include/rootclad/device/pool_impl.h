// rootclad/device/pool_impl.h — the definitions of the device kernels device/pool.h declares
// (its comments say what each computes), and the helpers they share.
#ifndef ROOTCLAD_DEVICE_POOL_IMPL_H
#define ROOTCLAD_DEVICE_POOL_IMPL_H

#include "pool.h"

namespace rootclad {
namespace dev {

// the windows [lo, hi] along one axis that hold input position `at`
inline ROOTCLAD_HD void pool_windows(int at, int K, int S, int P, int LO, int& lo, int& hi) {
  lo = at + P - K + 1;
  lo = lo <= 0 ? 0 : (lo + S - 1) / S;
  hi = (at + P) / S;
  if (hi > LO - 1)
    hi = LO - 1;
}

// MaxPool: the first maximum of a window (row-major) takes its gradient, as in torch.
template <class T>
ROOTCLAD_HD inline long maxpool_argmax(const T* x, const Pool& p, int oh, int ow) {
  long best = -1;
  for (int kh = 0; kh < p.KH; ++kh) {
    const int ih = oh * p.SH - p.PH + kh;
    if (ih < 0 || ih >= p.H)
      continue;
    for (int kw = 0; kw < p.KW; ++kw) {
      const int iw = ow * p.SW - p.PW + kw;
      const long at = (long)ih * p.W + iw;
      if (iw >= 0 && iw < p.W && (best < 0 || x[at] > x[best]))
        best = at;
    }
  }
  return best;
}

template <class On, class T, class Act>
void maxpool2d_forward(On on, T* out, const T* inp, long R, Pool p, Act act) {
  each_index(
      on, R * p.OH * p.OW, ROOTCLAD_BODY(long i) {
        const int ow = (int)(i % p.OW), oh = (int)(i / p.OW % p.OH);
        const T* x = inp + i / ((long)p.OW * p.OH) * p.H * p.W;
        out[i] = act.f(x[maxpool_argmax(x, p, oh, ow)]);
      });
}

// The backward of a pooling, gathered: d_inp[r, at] += the share share(d_out, r, at, oh, ow)
// gives of d_out[r, oh, ow] for each window (oh, ow) that holds input position at.
template <class On, class T, class DY, class Share>
void pool2d_backward(On on, T* d_inp, DY d_out, long R, Pool p, Share share) {
  each_index(
      on, R * p.H * p.W, ROOTCLAD_BODY(long i) {
        const long r = i / ((long)p.H * p.W), at = i % ((long)p.H * p.W);
        int h0, h1, w0, w1;
        pool_windows((int)(at / p.W), p.KH, p.SH, p.PH, p.OH, h0, h1);
        pool_windows((int)(at % p.W), p.KW, p.SW, p.PW, p.OW, w0, w1);
        T s = 0;
        for (int oh = h0; oh <= h1; ++oh)
          for (int ow = w0; ow <= w1; ++ow)
            s += share(d_out[(r * p.OH + oh) * p.OW + ow], r, at, oh, ow);
        d_inp[i] += s;
      });
}

// MaxPool: all of a window's gradient goes to its first maximum
template <class T> struct MaxPoolShare {
  const T* inp;
  Pool p;
  ROOTCLAD_HD T operator()(T dy, long r, long at, int oh, int ow) const {
    return maxpool_argmax(inp + r * p.H * p.W, p, oh, ow) == at ? dy : T(0);
  }
};

template <class On, class T, class DY>
void maxpool2d_backward(On on, T* d_inp, DY d_out, const T* inp, long R, Pool p) {
  pool2d_backward(on, d_inp, d_out, R, p, MaxPoolShare<T>{inp, p});
}

// AvgPool: with count_include_pad (torch's default) a window divides by KH*KW (less what a
// ceil_mode window runs past the padding), otherwise by its elements inside the input.
inline ROOTCLAD_HD int avgpool_divisor(const Pool& p, int oh, int ow, int count_include_pad) {
  return pool_span(oh * p.SH - p.PH, p.KH, p.H, p.PH, count_include_pad) *
         pool_span(ow * p.SW - p.PW, p.KW, p.W, p.PW, count_include_pad);
}

template <class On, class T, class Act>
void avgpool2d_forward(On on, T* out, const T* inp, long R, Pool p, int count_include_pad,
                       Act act) {
  each_index(
      on, R * p.OH * p.OW, ROOTCLAD_BODY(long i) {
        const int ow = (int)(i % p.OW), oh = (int)(i / p.OW % p.OH);
        const T* x = inp + i / ((long)p.OW * p.OH) * p.H * p.W;
        T s = 0;
        for (int kh = 0; kh < p.KH; ++kh) {
          const int ih = oh * p.SH - p.PH + kh;
          for (int kw = 0; kw < p.KW; ++kw) {
            const int iw = ow * p.SW - p.PW + kw;
            if (ih >= 0 && ih < p.H && iw >= 0 && iw < p.W)
              s += x[(long)ih * p.W + iw];
          }
        }
        out[i] = act.f(s / T(avgpool_divisor(p, oh, ow, count_include_pad)));
      });
}

// AvgPool: a window's gradient is shared evenly by its divisor
struct AvgPoolShare {
  Pool p;
  int count_include_pad;
  template <class T> ROOTCLAD_HD T operator()(T dy, long, long, int oh, int ow) const {
    return dy / T(avgpool_divisor(p, oh, ow, count_include_pad));
  }
};

template <class On, class T, class DY>
void avgpool2d_backward(On on, T* d_inp, DY d_out, long R, Pool p, int count_include_pad) {
  pool2d_backward(on, d_inp, d_out, R, p, AvgPoolShare{p, count_include_pad});
}

template <class T>
ROOTCLAD_HD inline long adaptive_argmax(const T* x, const Adaptive& a, int oh, int ow) {
  long at = -1; // the first maximum, or the last NaN, as torch
  for (int h = adaptive_start(oh, a.H, a.OH); h < adaptive_end(oh, a.H, a.OH); ++h)
    for (int w = adaptive_start(ow, a.W, a.OW); w < adaptive_end(ow, a.W, a.OW); ++w) {
      const long i = (long)h * a.W + w;
      if (at < 0 || x[i] > x[at] || x[i] != x[i])
        at = i;
    }
  return at;
}

template <class On, class T>
void adaptive_maxpool_forward(On on, T* out, const T* inp, long R, Adaptive a) {
  each_index(
      on, R * a.OH * a.OW, ROOTCLAD_BODY(long i) {
        const int ow = (int)(i % a.OW), oh = (int)(i / a.OW % a.OH);
        const T* x = inp + i / ((long)a.OW * a.OH) * a.H * a.W;
        out[i] = x[adaptive_argmax(x, a, oh, ow)];
      });
}

template <class On, class T>
void adaptive_avgpool_forward(On on, T* out, const T* inp, long R, Adaptive a) {
  each_index(
      on, R * a.OH * a.OW, ROOTCLAD_BODY(long i) {
        const int ow = (int)(i % a.OW), oh = (int)(i / a.OW % a.OH);
        const T* x = inp + i / ((long)a.OW * a.OH) * a.H * a.W;
        const int h0 = adaptive_start(oh, a.H, a.OH), h1 = adaptive_end(oh, a.H, a.OH);
        const int w0 = adaptive_start(ow, a.W, a.OW), w1 = adaptive_end(ow, a.W, a.OW);
        T s = 0;
        for (int h = h0; h < h1; ++h)
          for (int w = w0; w < w1; ++w)
            s += x[(long)h * a.W + w];
        out[i] = s / T((h1 - h0) * (w1 - w0));
      });
}

// the windows along one axis that hold position at: [lo, hi]; windows are at most
// ceil(n / O) + 1 wide and at least 1 apart, so they start within that reach of at
inline ROOTCLAD_HD void adaptive_windows(int at, int n, int O, int& lo, int& hi) {
  lo = (int)((long)at * O / n) - 1;
  lo = lo < 0 ? 0 : lo;
  while (lo < O && adaptive_end(lo, n, O) <= at)
    ++lo;
  hi = lo;
  while (hi + 1 < O && adaptive_start(hi + 1, n, O) <= at)
    ++hi;
}

template <class On, class T>
void adaptive_pool_backward(On on, T* d_inp, const T* d_out, const T* inp, long R, Adaptive a,
                            int is_max) {
  each_index(
      on, R * a.H * a.W, ROOTCLAD_BODY(long i) {
        const long r = i / ((long)a.H * a.W), at = i % ((long)a.H * a.W);
        int h0, h1, w0, w1;
        adaptive_windows((int)(at / a.W), a.H, a.OH, h0, h1);
        adaptive_windows((int)(at % a.W), a.W, a.OW, w0, w1);
        T s = 0;
        for (int oh = h0; oh <= h1; ++oh)
          for (int ow = w0; ow <= w1; ++ow) {
            const T dy = d_out[(r * a.OH + oh) * a.OW + ow];
            if (is_max)
              s += adaptive_argmax(inp + r * a.H * a.W, a, oh, ow) == at ? dy : T(0);
            else
              s += dy / T((adaptive_end(oh, a.H, a.OH) - adaptive_start(oh, a.H, a.OH)) *
                          (adaptive_end(ow, a.W, a.OW) - adaptive_start(ow, a.W, a.OW)));
          }
        d_inp[i] += s;
      });
}

// the first maximum of a row, or its last NaN, as torch
template <class T> ROOTCLAD_HD inline int row_argmax(const T* x, int L) {
  int best = 0; // the first maximum, or the last NaN, as torch
  for (int l = 1; l < L; ++l)
    best = (x[l] > x[best] || x[l] != x[l]) ? l : best;
  return best;
}

template <class On, class T>
void global_maxpool_forward(On on, T* out, const T* inp, long R, int L) {
  each_index(on, R, ROOTCLAD_BODY(long r) { out[r] = inp[r * L + row_argmax(inp + r * L, L)]; });
}

template <class On, class T>
void global_maxpool_backward(On on, T* d_inp, const T* d_out, const T* inp, long R, int L) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) { d_inp[r * L + row_argmax(inp + r * L, L)] += d_out[r]; });
}

template <class On, class T> void amax_forward(On on, T* out, const T* inp, long R, int L) {
  each_index(on, R, ROOTCLAD_BODY(long r) { out[r] = amax_row(inp + r * L, L); });
}

template <class On, class T>
void amax_backward(On on, T* d_inp, const T* d_out, const T* inp, long R, int L) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) { amax_row_backward(d_inp + r * L, inp + r * L, L, d_out[r]); });
}

template <class On, class T>
void global_avgpool_forward(On on, T* out, const T* inp, long R, int L) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) {
        T s = 0;
        for (int l = 0; l < L; ++l)
          s += inp[r * L + l];
        out[r] = s / T(L);
      });
}

template <class On, class T>
void global_avgpool_backward(On on, T* d_inp, const T* d_out, long R, int L) {
  each_index(on, R * L, ROOTCLAD_BODY(long i) { d_inp[i] += d_out[i / L] / T(L); });
}

// position i's weight in output o along one axis (both ends of a linear pair may be i)
template <class T> ROOTCLAD_HD inline T upsample_weight(int o, int i, int n, int O, int mode, T s) {
  const int i0 = upsample_i0(o, n, O, mode, s), i1 = upsample_i1(i0, n, O, mode);
  const T l = upsample_lambda(o, n, O, mode, s);
  return (i0 == i ? T(1) - l : T(0)) + (i1 == i ? l : T(0));
}

// the outputs along one axis that read position i: [lo, hi), found by bisection (i0 and i1
// never decrease with o)
template <class T>
ROOTCLAD_HD inline void upsample_readers(int i, int n, int O, int mode, T s, int& lo, int& hi) {
  int a = 0, b = O;
  while (a < b) { // the first o with i1(o) >= i
    const int m = (a + b) / 2;
    if (upsample_i1(upsample_i0(m, n, O, mode, s), n, O, mode) >= i)
      b = m;
    else
      a = m + 1;
  }
  lo = a;
  b = O;
  while (a < b) { // the first o with i0(o) > i
    const int m = (a + b) / 2;
    if (upsample_i0(m, n, O, mode, s) <= i)
      a = m + 1;
    else
      b = m;
  }
  hi = a;
}

template <class On, class T>
void upsample_forward(On on, T* out, const T* inp, long R, Upsample<T> u) {
  each_index(
      on, R * u.OH * u.OW, ROOTCLAD_BODY(long i) {
        const int ow = (int)(i % u.OW), oh = (int)(i / u.OW % u.OH);
        const T* x = inp + i / ((long)u.OW * u.OH) * u.H * u.W;
        const int h0 = upsample_i0(oh, u.H, u.OH, u.mode, u.sh);
        const int w0 = upsample_i0(ow, u.W, u.OW, u.mode, u.sw);
        if (u.mode == 0 || u.mode == 3) {
          out[i] = x[(long)h0 * u.W + w0];
          return;
        }
        const int h1 = upsample_i1(h0, u.H, u.OH, u.mode), w1 = upsample_i1(w0, u.W, u.OW, u.mode);
        const T lh = upsample_lambda(oh, u.H, u.OH, u.mode, u.sh);
        const T lw = upsample_lambda(ow, u.W, u.OW, u.mode, u.sw);
        out[i] =
            (T(1) - lh) * ((T(1) - lw) * x[(long)h0 * u.W + w0] + lw * x[(long)h0 * u.W + w1]) +
            lh * ((T(1) - lw) * x[(long)h1 * u.W + w0] + lw * x[(long)h1 * u.W + w1]);
      });
}

template <class On, class T>
void upsample_backward(On on, T* d_inp, const T* d_out, long R, Upsample<T> u) {
  each_index(
      on, R * u.H * u.W, ROOTCLAD_BODY(long i) {
        const long r = i / ((long)u.H * u.W);
        const int ih = (int)(i / u.W % u.H), iw = (int)(i % u.W);
        int h0, h1, w0, w1;
        upsample_readers(ih, u.H, u.OH, u.mode, u.sh, h0, h1);
        upsample_readers(iw, u.W, u.OW, u.mode, u.sw, w0, w1);
        T s = 0;
        for (int oh = h0; oh < h1; ++oh) {
          const T wh = upsample_weight(oh, ih, u.H, u.OH, u.mode, u.sh);
          for (int ow = w0; ow < w1; ++ow)
            s += wh * upsample_weight(ow, iw, u.W, u.OW, u.mode, u.sw) *
                 d_out[(r * u.OH + oh) * u.OW + ow];
        }
        d_inp[i] += s;
      });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_POOL_IMPL_H
