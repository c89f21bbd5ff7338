// rootclad/ops/norm_impl.h — the definitions of the kernels norm.h declares (its comments say
// what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_NORM_IMPL_H
#define ROOTCLAD_OPS_NORM_IMPL_H

#include "core.h"
#include "norm.h"

namespace rootclad {

template <typename T> void softmax_forward(T* out, const T* inp, int R, int N, int S) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) {
      const long base = (long)r * N * S + s;
      T m = inp[base];
      for (int n = 1; n < N; ++n)
        m = inp[base + (long)n * S] > m ? inp[base + (long)n * S] : m;
      T sum = 0;
      for (int n = 0; n < N; ++n) {
        out[base + (long)n * S] = std::exp(inp[base + (long)n * S] - m);
        sum += out[base + (long)n * S];
      }
      for (int n = 0; n < N; ++n)
        out[base + (long)n * S] /= sum;
    }
}
template <typename T> void safe_softmax_forward(T* out, const T* inp, int R, int N, int S) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) {
      const long base = (long)r * N * S + s;
      T m = inp[base];
      for (int n = 1; n < N; ++n)
        m = inp[base + (long)n * S] > m ? inp[base + (long)n * S] : m;
      if (m == -T(INFINITY)) {
        for (int n = 0; n < N; ++n)
          out[base + (long)n * S] = T(0);
        continue;
      }
      T sum = 0;
      for (int n = 0; n < N; ++n) {
        out[base + (long)n * S] = std::exp(inp[base + (long)n * S] - m);
        sum += out[base + (long)n * S];
      }
      for (int n = 0; n < N; ++n)
        out[base + (long)n * S] /= sum;
    }
}

template <typename T>
void softmax_backward(T* d_inp, const T* d_out, const T* out, int R, int N, int S) {
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) {
      const long base = (long)r * N * S + s;
      T dot = 0;
      for (int n = 0; n < N; ++n)
        dot += d_out[base + (long)n * S] * out[base + (long)n * S];
      for (int n = 0; n < N; ++n)
        d_inp[base + (long)n * S] += out[base + (long)n * S] * (d_out[base + (long)n * S] - dot);
    }
}

template <typename T> void log_softmax_forward(T* out, const T* inp, int R, int N, int S) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) {
      const long base = (long)r * N * S + s;
      T m = inp[base];
      for (int n = 1; n < N; ++n)
        m = inp[base + (long)n * S] > m ? inp[base + (long)n * S] : m;
      T sum = 0;
      for (int n = 0; n < N; ++n)
        sum += std::exp(inp[base + (long)n * S] - m);
      const T lse = m + std::log(sum);
      for (int n = 0; n < N; ++n)
        out[base + (long)n * S] = inp[base + (long)n * S] - lse;
    }
}
template <typename T>
void log_softmax_backward(T* d_inp, const T* d_out, const T* out, int R, int N, int S) {
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) {
      const long base = (long)r * N * S + s;
      T sum = 0;
      for (int n = 0; n < N; ++n)
        sum += d_out[base + (long)n * S];
      for (int n = 0; n < N; ++n)
        d_inp[base + (long)n * S] +=
            d_out[base + (long)n * S] - std::exp(out[base + (long)n * S]) * sum;
    }
}

template <typename T>
void layer_norm_forward(T* out, T* stats, const T* inp, const T* weight, const T* bias, int R,
                        int M, T eps) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r) {
    const T* x = inp + (long)r * M;
    T mean = 0;
    for (int i = 0; i < M; ++i)
      mean += x[i];
    mean /= M;
    T var = 0;
    for (int i = 0; i < M; ++i)
      var += (x[i] - mean) * (x[i] - mean);
    var /= M;
    const T rstd = T(1) / std::sqrt(var + eps);
    stats[2 * (long)r] = mean;
    stats[2 * (long)r + 1] = rstd;
    for (int i = 0; i < M; ++i) {
      T y = (x[i] - mean) * rstd;
      if (weight)
        y *= weight[i];
      if (bias)
        y += bias[i];
      out[(long)r * M + i] = y;
    }
  }
}
template <typename T>
void layer_norm_backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                         const T* stats, const T* weight, int R, int M) {
  for (int r = 0; r < R; ++r) {
    const T* x = inp + (long)r * M;
    const T* dy = d_out + (long)r * M;
    const T mean = stats[2 * (long)r], rstd = stats[2 * (long)r + 1];
    T sum_g = 0, sum_gx = 0;
    for (int i = 0; i < M; ++i) {
      const T xhat = (x[i] - mean) * rstd;
      const T g = weight ? dy[i] * weight[i] : dy[i];
      sum_g += g;
      sum_gx += g * xhat;
      if (d_weight)
        d_weight[i] += dy[i] * xhat;
      if (d_bias)
        d_bias[i] += dy[i];
    }
    for (int i = 0; i < M; ++i) {
      const T xhat = (x[i] - mean) * rstd;
      const T g = weight ? dy[i] * weight[i] : dy[i];
      d_inp[(long)r * M + i] += rstd * (g - sum_g / M - xhat * sum_gx / M);
    }
  }
}

template <typename T>
void batch_norm_forward(T* out, T* stats, const T* inp, const T* weight, const T* bias,
                        T* running_mean, T* running_var, T* tracked, int B, int C, int S, T eps,
                        T momentum, int training) {
  ROOTCLAD_REPLAY_SKIP;
  const bool batch_stats = training || !running_mean;
  // a batch split into chunks over threads: the sums are the whole batch's (parallel.h)
  const ChunkSync* sync = batch_stats ? chunk_sync() : nullptr;
  T n = T(B) * S;
  if (batch_stats) {
    // sums over B*S values in double (float loses ~1e-3 of 1/std at B*S ~ 3e6, as torch's
    // CPU kernel avoids by accumulating in double too)
    for (int c = 0; c < C; ++c) { // the mean, in stats[2c]
      double sum = 0;
      for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s)
          sum += inp[((long)b * C + c) * S + s];
      stats[2 * c] = (T)sum;
    }
    if (sync) { // the sums at stats[0, 2, .., 2C - 2] and the count at stats[2C]
      stats[2 * C] = n;
      sync->all_reduce(stats, C + 1, 2);
      n = stats[2 * C];
    }
    for (int c = 0; c < C; ++c)
      stats[2 * c] /= n;
    for (int c = 0; c < C; ++c) { // the biased variance, in stats[2c + 1]
      double var = 0;
      for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s) {
          const double d = inp[((long)b * C + c) * S + s] - stats[2 * c];
          var += d * d;
        }
      stats[2 * c + 1] = (T)var;
    }
    if (sync) // at stats[1, 3, .., 2C - 1]
      sync->all_reduce(stats + 1, C, 2);
    for (int c = 0; c < C; ++c) {
      const T var = stats[2 * c + 1] / n;
      if (training && running_mean && (!sync || sync->t == 0)) {
        running_mean[c] = (T(1) - momentum) * running_mean[c] + momentum * stats[2 * c];
        const T unbiased = n > 1 ? var * n / (n - 1) : var;
        running_var[c] = (T(1) - momentum) * running_var[c] + momentum * unbiased;
      }
      stats[2 * c + 1] = T(1) / std::sqrt(var + eps);
    }
  } else {
    for (int c = 0; c < C; ++c) {
      stats[2 * c] = running_mean[c];
      stats[2 * c + 1] = T(1) / std::sqrt(running_var[c] + eps);
    }
  }
  // out = x * alpha + beta, alpha = rstd * w, beta = shift - mean * alpha (torch's CPU kernel's
  // form), sample by sample in memory order
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c) {
      const T alpha = stats[2 * c + 1] * (weight ? weight[c] : T(1));
      const T beta = (bias ? bias[c] : T(0)) - stats[2 * c] * alpha;
      const T* x = inp + ((long)b * C + c) * S;
      T* y = out + ((long)b * C + c) * S;
      ROOTCLAD_SIMD
      for (int s = 0; s < S; ++s)
        y[s] = x[s] * alpha + beta;
    }
  if (training && tracked && (!sync || sync->t == 0))
    tracked[0] += T(1);
}

template <typename T>
void batch_norm_backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                         const T* stats, const T* weight, const T* running_mean, int B, int C,
                         int S, int training, T* sums) {
  const bool batch_stats = training || !running_mean;
  const ChunkSync* sync = batch_stats ? chunk_sync() : nullptr;
  // sums (2C + 1 values): per channel sum d_out and sum d_out * xhat over this chunk, then,
  // in a batch split into chunks, over the whole batch (parallel.h), and the count
  for (int c = 0; c < C; ++c) {
    const T mean = stats[2 * c];
    const T rstd = stats[2 * c + 1];
    double sum_g = 0; // over B*S values: in double, as the forward's sums
    double sum_gx = 0;
    for (int b = 0; b < B; ++b)
      for (int s = 0; s < S; ++s) {
        const long i = ((long)b * C + c) * S + s;
        sum_g += d_out[i];
        sum_gx += d_out[i] * (inp[i] - mean) * rstd;
      }
    if (d_weight) // this chunk's share: the chunks' parameter gradients are summed later
      d_weight[c] += (T)sum_gx;
    if (d_bias)
      d_bias[c] += (T)sum_g;
    sums[2 * c] = (T)sum_g;
    sums[2 * c + 1] = (T)sum_gx;
  }
  sums[2 * C] = T(B) * S;
  if (sync)
    sync->all_reduce(sums, 2 * C + 1);
  const T n = sums[2 * C];
  for (int c = 0; c < C; ++c) {
    const T mean = stats[2 * c];
    const T rstd = stats[2 * c + 1];
    const T w = weight ? weight[c] : T(1);
    for (int b = 0; b < B; ++b)
      for (int s = 0; s < S; ++s) {
        const long i = ((long)b * C + c) * S + s;
        const T xhat = (inp[i] - mean) * rstd;
        T dx = w * rstd * d_out[i];
        if (batch_stats)
          dx -= w * rstd * (sums[2 * c] + xhat * sums[2 * c + 1]) / n;
        d_inp[i] += dx;
      }
  }
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_NORM_IMPL_H
