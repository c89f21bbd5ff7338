// rootclad/ops/topk_select.h — topk's selection along one strided row: sorted, NaN the largest
// (as torch), equal values the lower index first (as torch's stable sort; torch.topk itself
// promises no order among them); shared by the CPU kernel (shape.h) and the device's
// (device/shape.h).
#ifndef ROOTCLAD_OPS_TOPK_SELECT_H
#define ROOTCLAD_OPS_TOPK_SELECT_H

#include "../hd.h"

namespace rootclad {

// Whether a comes before b: the larger first (largest) or the smaller first. NaN counts as
// larger than any number, as in torch.
template <typename T> ROOTCLAD_HD inline bool topk_before(T a, T b, int largest) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan || b_nan)
    return largest ? a_nan && !b_nan : b_nan && !a_nan;
  return largest ? a > b : a < b;
}

// The indices of the K first of x[0], x[Q], ..., x[(N-1) Q] in that order, written (as exact
// integers) to out[0], out[Q], ...: an insertion into the K kept so far, so equal values keep
// the lower index first.
template <typename T>
ROOTCLAD_HD inline void topk_select(T* out, const T* x, int N, int K, long Q, int largest) {
  int kept = 0;
  for (int n = 0; n < N; ++n) {
    const T v = x[n * Q];
    if (kept == K && !topk_before(v, x[(long)out[(K - 1) * Q] * Q], largest))
      continue;
    int j = kept < K ? kept++ : K - 1;
    for (; j > 0 && topk_before(v, x[(long)out[(j - 1) * Q] * Q], largest); --j)
      out[j * Q] = out[(j - 1) * Q];
    out[j * Q] = T(n);
  }
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_TOPK_SELECT_H
