// rootclad/ops/window_geometry.h — the scores of a Swin Transformer's shifted-window attention
// (torchvision's shifted_window_attention): per sample, scores x(nh * nw, heads, N, N) of the
// nh x nw windows of wh x ww tokens (N = wh * ww) get the relative position bias
// table[idx(q, k) * heads + head] (idx: torchvision's relative_position_index), and, where the
// windows were shifted by (sh, sw), -100 between tokens of different regions (torchvision's
// attn_mask). One element at a time (ROOTCLAD_HD): the CPU kernels (windows.h) run them as
// loops, the device's (device/windows.h) as one thread each.
#ifndef ROOTCLAD_OPS_WINDOW_GEOMETRY_H
#define ROOTCLAD_OPS_WINDOW_GEOMETRY_H

#include "../hd.h"

namespace rootclad {

struct Win {
  int nh, nw, wh, ww, heads, sh, sw;
  ROOTCLAD_HD int n() const { return wh * ww; } // tokens a window
  ROOTCLAD_HD long per_sample() const { return (long)nh * nw * heads * n() * n(); }
  ROOTCLAD_HD int table_rows() const { return (2 * wh - 1) * (2 * ww - 1); }
};

// the table row of query q and key k of one window (torchvision's relative_position_index)
ROOTCLAD_HD inline int win_bias_row(const Win& w, int q, int k) {
  return (q / w.ww - k / w.ww + w.wh - 1) * (2 * w.ww - 1) + (q % w.ww - k % w.ww + w.ww - 1);
}

// The region (0, 1, 2) of position y of P along an axis of windows of size s, shifted by sh:
// torchvision fills its slices (0, -s), (-s, -sh), (-sh, None) in turn, so that without a
// shift the last covers the whole axis.
ROOTCLAD_HD inline int win_region(int y, int P, int s, int sh) {
  return sh == 0 ? 2 : (y < P - s ? 0 : (y < P - sh ? 1 : 2));
}

// whether the shifted-window mask separates query q from key k in window win
ROOTCLAD_HD inline bool win_masked(const Win& w, int win, int q, int k) {
  if (w.sh == 0 && w.sw == 0)
    return false;
  const int y0 = win / w.nw * w.wh, x0 = win % w.nw * w.ww, H = w.nh * w.wh, W = w.nw * w.ww;
  const int rq =
      win_region(y0 + q / w.ww, H, w.wh, w.sh) * 3 + win_region(x0 + q % w.ww, W, w.ww, w.sw);
  const int rk =
      win_region(y0 + k / w.ww, H, w.wh, w.sh) * 3 + win_region(x0 + k % w.ww, W, w.ww, w.sw);
  return rq != rk;
}

// element i of a sample's scores: (win, head, q, k) -> the biased (and masked) score, added in
// torchvision's order
template <class T>
ROOTCLAD_HD inline T win_biased(const Win& w, const T* x, const T* table, long i) {
  const int N = w.n();
  const int k = (int)(i % N), q = (int)(i / N % N), head = (int)(i / ((long)N * N) % w.heads);
  const int win = (int)(i / ((long)N * N * w.heads));
  T v = x[i] + table[(long)win_bias_row(w, q, k) * w.heads + head];
  if (win_masked(w, win, q, k))
    v = v + T(-100);
  return v;
}

// d table[e] (e = row * heads + head) of one sample: the sum of d_out over the (win, q, k) that
// read it; each query has at most one such key
template <class T> ROOTCLAD_HD inline T win_table_grad(const Win& w, const T* d_out, long e) {
  const int row = (int)(e / w.heads), head = (int)(e % w.heads), N = w.n();
  const int dh = row / (2 * w.ww - 1) - (w.wh - 1), dw = row % (2 * w.ww - 1) - (w.ww - 1);
  T s = 0;
  for (int win = 0; win < w.nh * w.nw; ++win)
    for (int q = 0; q < N; ++q) {
      const int kh = q / w.ww - dh, kw = q % w.ww - dw;
      if (kh < 0 || kh >= w.wh || kw < 0 || kw >= w.ww)
        continue;
      s += d_out[(((long)win * w.heads + head) * N + q) * N + kh * w.ww + kw];
    }
  return s;
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_WINDOW_GEOMETRY_H
