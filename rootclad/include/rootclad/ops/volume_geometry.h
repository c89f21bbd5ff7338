// rootclad/ops/volume_geometry.h — 3-d convolution and pooling (Conv3d, MaxPool3d, AvgPool3d)
// over inp(B, C, D, H, W), one element at a time: each output, input-gradient and
// weight-gradient element is a function of its flat index (ROOTCLAD_HD), which the CPU kernels
// (volume.h) run as loops and the device's (device/volume.h) as one thread each. Direct loops
// over the windows, no im2col: the speed targets are 1-d and 2-d models.
#ifndef ROOTCLAD_OPS_VOLUME_GEOMETRY_H
#define ROOTCLAD_OPS_VOLUME_GEOMETRY_H

#include <cmath>

#include "../hd.h"
#include "pool_geometry.h"

namespace rootclad {

// The windows along D, H, W: input and output sizes, kernel, stride, zero padding, dilation
// (1 for pooling). The output sizes come from the caller (ceil_mode is the IR's business).
struct Vol {
  int D, H, W, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW;
  ROOTCLAD_HD long in_size() const { return (long)D * H * W; }
  ROOTCLAD_HD long out_size() const { return (long)OD * OH * OW; }
  ROOTCLAD_HD long taps() const { return (long)KD * KH * KW; }
};

// The input position tap t of output position p reads ((id, ih, iw) packed), or -1 outside
ROOTCLAD_HD inline long vol_source(const Vol& v, long p, long t) {
  const int ow = (int)(p % v.OW), oh = (int)(p / v.OW % v.OH), od = (int)(p / ((long)v.OW * v.OH));
  const int kw = (int)(t % v.KW), kh = (int)(t / v.KW % v.KH), kd = (int)(t / ((long)v.KW * v.KH));
  const int id = od * v.SD - v.PD + kd * v.DD, ih = oh * v.SH - v.PH + kh * v.DH,
            iw = ow * v.SW - v.PW + kw * v.DW;
  if (id < 0 || id >= v.D || ih < 0 || ih >= v.H || iw < 0 || iw >= v.W)
    return -1;
  return ((long)id * v.H + ih) * v.W + iw;
}

// -- Conv3d: weight(OC, C/G, KD, KH, KW), G groups ---------------------------------------------
// out[b, o, p] = bias[o] + sum over the group's channels c and taps t of w[o, c, t] x[b, c, src]
template <typename T>
ROOTCLAD_HD T conv3d_at(const Vol& v, int C, int OC, int G, const T* x, const T* w, const T* bias,
                        long i) {
  const long P = v.out_size(), taps = v.taps();
  const long p = i % P, bo = i / P;
  const int o = (int)(bo % OC), Cg = C / G, g = o / (OC / G);
  const T* xb = x + (bo / OC * C + (long)g * Cg) * v.in_size();
  T s = bias ? bias[o] : T(0);
  for (long t = 0; t < taps; ++t) {
    const long src = vol_source(v, p, t);
    if (src < 0)
      continue;
    for (int c = 0; c < Cg; ++c)
      s += w[((long)o * Cg + c) * taps + t] * xb[c * v.in_size() + src];
  }
  return s;
}

// d_x[b, c, q]: over the group's outputs o and the taps that read q from some output position
template <typename T>
ROOTCLAD_HD T conv3d_dinp_at(const Vol& v, int C, int OC, int G, const T* d_out, const T* w,
                             long i) {
  const long N = v.in_size(), q = i % N, bc = i / N;
  const int c = (int)(bc % C), Cg = C / G, OCg = OC / G, g = c / Cg;
  const int iw = (int)(q % v.W), ih = (int)(q / v.W % v.H), id = (int)(q / ((long)v.W * v.H));
  T s = 0;
  for (int kd = 0; kd < v.KD; ++kd) {
    const int td = id + v.PD - kd * v.DD;
    if (td < 0 || td % v.SD || td / v.SD >= v.OD)
      continue;
    for (int kh = 0; kh < v.KH; ++kh) {
      const int th = ih + v.PH - kh * v.DH;
      if (th < 0 || th % v.SH || th / v.SH >= v.OH)
        continue;
      for (int kw = 0; kw < v.KW; ++kw) {
        const int tw = iw + v.PW - kw * v.DW;
        if (tw < 0 || tw % v.SW || tw / v.SW >= v.OW)
          continue;
        const long p = ((long)(td / v.SD) * v.OH + th / v.SH) * v.OW + tw / v.SW;
        const long t = ((long)kd * v.KH + kh) * v.KW + kw;
        for (int o = g * OCg; o < (g + 1) * OCg; ++o)
          s += w[((long)o * Cg + c % Cg) * v.taps() + t] *
               d_out[(bc / C * OC + o) * v.out_size() + p];
      }
    }
  }
  return s;
}

// d_w[o, c, t]: over the batch and the output positions whose tap t is inside the input
template <typename T>
ROOTCLAD_HD T conv3d_dweight_at(const Vol& v, int B, int C, int OC, int G, const T* d_out,
                                const T* x, long j) {
  const long taps = v.taps(), t = j % taps, oc = j / taps;
  const int Cg = C / G, cc = (int)(oc % Cg), o = (int)(oc / Cg), g = o / (OC / G);
  T s = 0;
  for (int b = 0; b < B; ++b) {
    const T* xb = x + ((long)b * C + (long)g * Cg + cc) * v.in_size();
    const T* dy = d_out + ((long)b * OC + o) * v.out_size();
    for (long p = 0; p < v.out_size(); ++p) {
      const long src = vol_source(v, p, t);
      if (src >= 0)
        s += dy[p] * xb[src];
    }
  }
  return s;
}

template <typename T>
ROOTCLAD_HD T conv3d_dbias_at(const Vol& v, int B, int OC, const T* d_out, int o) {
  T s = 0;
  for (long b = 0; b < B; ++b)
    for (long p = 0; p < v.out_size(); ++p)
      s += d_out[(b * OC + o) * v.out_size() + p];
  return s;
}

// -- MaxPool3d / AvgPool3d over rows R = B*C (padding excluded from a max) --------------------
// The input a max window takes (row-major window order: the first maximum, or the last NaN,
// as torch), -1 for none
template <typename T> ROOTCLAD_HD long maxpool3d_arg(const Vol& v, const T* x, long i) {
  const long P = v.out_size(), p = i % P, base = i / P * v.in_size();
  long at = -1;
  T m = T(0);
  for (long t = 0; t < v.taps(); ++t) {
    const long src = vol_source(v, p, t);
    if (src < 0)
      continue;
    const T val = x[base + src];
    if (at < 0 || val > m || val != val) {
      at = base + src;
      m = val;
    }
  }
  return at;
}

// The positions an average window divides by (pool_geometry.h's pool_span along each axis)
ROOTCLAD_HD inline int avgpool3d_div(const Vol& v, long p, int count_include_pad) {
  const int ow = (int)(p % v.OW), oh = (int)(p / v.OW % v.OH), od = (int)(p / ((long)v.OW * v.OH));
  return pool_span(od * v.SD - v.PD, v.KD, v.D, v.PD, count_include_pad) *
         pool_span(oh * v.SH - v.PH, v.KH, v.H, v.PH, count_include_pad) *
         pool_span(ow * v.SW - v.PW, v.KW, v.W, v.PW, count_include_pad);
}

template <typename T>
ROOTCLAD_HD T avgpool3d_at(const Vol& v, const T* x, int count_include_pad, long i) {
  const long P = v.out_size(), p = i % P, base = i / P * v.in_size();
  T s = 0;
  for (long t = 0; t < v.taps(); ++t) {
    const long src = vol_source(v, p, t);
    if (src >= 0)
      s += x[base + src];
  }
  const int div = avgpool3d_div(v, p, count_include_pad);
  return div > 0 ? s / T(div) : T(0);
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_VOLUME_GEOMETRY_H
