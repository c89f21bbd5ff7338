// rootclad/device/norm_impl.h — the definitions of the device kernels device/norm.h declares
// (its comments say what each computes), and the helpers they share.
#ifndef ROOTCLAD_DEVICE_NORM_IMPL_H
#define ROOTCLAD_DEVICE_NORM_IMPL_H

#include "norm.h"

namespace rootclad {
namespace dev {

template <class On, class T>
void softmax_forward(On on, T* out, const T* inp, long R, int N, int S, int log_form) {
  each_index(
      on, R * S, ROOTCLAD_BODY(long line) {
        const long base = line / S * N * S + line % S;
        T m = inp[base];
        for (int k = 1; k < N; ++k)
          m = inp[base + (long)k * S] > m ? inp[base + (long)k * S] : m;
        if (log_form == 2 && m == -T(INFINITY)) {
          for (int k = 0; k < N; ++k)
            out[base + (long)k * S] = T(0);
          return;
        }
        T sum = 0;
        for (int k = 0; k < N; ++k)
          sum += exp(inp[base + (long)k * S] - m);
        const T lse = m + log(sum);
        for (int k = 0; k < N; ++k) {
          const T z = inp[base + (long)k * S] - lse;
          out[base + (long)k * S] = log_form == 1 ? z : exp(z);
        }
      });
}

template <class On, class T>
void softmax_backward(On on, T* d_inp, const T* d_out, const T* out, long R, int N, int S,
                      int log_form) {
  each_index(
      on, R * S, ROOTCLAD_BODY(long line) {
        const long base = line / S * N * S + line % S;
        T sum = 0;
        for (int k = 0; k < N; ++k)
          sum += log_form == 1 ? d_out[base + (long)k * S]
                               : d_out[base + (long)k * S] * out[base + (long)k * S];
        for (int k = 0; k < N; ++k) {
          const long at = base + (long)k * S;
          d_inp[at] += log_form == 1 ? d_out[at] - exp(out[at]) * sum : out[at] * (d_out[at] - sum);
        }
      });
}

template <class On, class T>
void layer_norm_forward(On on, T* out, T* stats, const T* inp, const T* weight, const T* bias,
                        long R, int M, T eps) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) {
        const T* x = inp + r * M;
        T mean = 0, var = 0;
        for (int i = 0; i < M; ++i)
          mean += x[i];
        mean /= T(M);
        for (int i = 0; i < M; ++i)
          var += (x[i] - mean) * (x[i] - mean);
        const T rstd = T(1) / sqrt(var / T(M) + eps);
        stats[2 * r] = mean;
        stats[2 * r + 1] = rstd;
        for (int i = 0; i < M; ++i)
          out[r * M + i] =
              (x[i] - mean) * rstd * (weight ? weight[i] : T(1)) + (bias ? bias[i] : T(0));
      });
}

template <class On, class T>
void layer_norm_backward_params(On on, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                                const T* stats, long R, int M) {
  if (!d_weight && !d_bias)
    return;
  const long chunks = batch_chunks(M, R);
  each_index(
      on, M * chunks, ROOTCLAD_BODY(long j) {
        const long i = j % M, chunk = j / M;
        T sw = 0, sb = 0;
        for (long r = R * chunk / chunks; r < R * (chunk + 1) / chunks; ++r) {
          sw += d_out[r * M + i] * (inp[r * M + i] - stats[2 * r]) * stats[2 * r + 1];
          sb += d_out[r * M + i];
        }
        if (d_weight)
          add_to(d_weight + i, sw);
        if (d_bias)
          add_to(d_bias + i, sb);
      });
}

template <class On, class T>
void layer_norm_backward_input(On on, T* d_inp, const T* d_out, const T* inp, const T* stats,
                               const T* weight, long R, int M) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) {
        const T mean = stats[2 * r], rstd = stats[2 * r + 1];
        T sum_g = 0, sum_gx = 0;
        for (int i = 0; i < M; ++i) {
          const T g = d_out[r * M + i] * (weight ? weight[i] : T(1));
          sum_g += g;
          sum_gx += g * (inp[r * M + i] - mean) * rstd;
        }
        for (int i = 0; i < M; ++i) {
          const T g = d_out[r * M + i] * (weight ? weight[i] : T(1));
          const T xhat = (inp[r * M + i] - mean) * rstd;
          d_inp[r * M + i] += rstd * (g - sum_g / T(M) - xhat * sum_gx / T(M));
        }
      });
}

inline ROOTCLAD_HD long bn_chunks(long B) {
  return B < BN_CHUNKS ? B : BN_CHUNKS;
}

template <class On, class T>
void batch_norm_stats(On on, T* stats, const T* inp, T* running_mean, T* running_var, T* tracked,
                      long B, int C, long S, T eps, T momentum, int training) {
  const long chunks = bn_chunks(B);
  T* part = stats + 4 * C;
  if (training || !running_mean)
    each_index(
        on, C * chunks, ROOTCLAD_BODY(long i) {
          const long c = i / chunks, k = i % chunks;
          const long b0 = B * k / chunks, b1 = B * (k + 1) / chunks;
          double sum = 0, m2 = 0;
          for (long b = b0; b < b1; ++b)
            for (long s = 0; s < S; ++s)
              sum += inp[(b * C + c) * S + s];
          const double mean = sum / ((b1 - b0) * S);
          for (long b = b0; b < b1; ++b)
            for (long s = 0; s < S; ++s) {
              const double d = inp[(b * C + c) * S + s] - mean;
              m2 += d * d;
            }
          part[3 * i] = T((b1 - b0) * S);
          part[3 * i + 1] = T(mean);
          part[3 * i + 2] = T(m2);
        });
  each_index(
      on, (long)C, ROOTCLAD_BODY(long c) {
        if (!training && running_mean) {
          stats[2 * c] = running_mean[c];
          stats[2 * c + 1] = T(1) / sqrt(running_var[c] + eps);
          return;
        }
        const T* pc = part + 3 * c * chunks;
        double n = 0, mean = 0;
        for (long k = 0; k < chunks; ++k) {
          n += pc[3 * k];
          mean += (double)pc[3 * k] * pc[3 * k + 1];
        }
        mean /= n;
        double var = 0;
        for (long k = 0; k < chunks; ++k) {
          const double d = pc[3 * k + 1] - mean;
          var += pc[3 * k + 2] + pc[3 * k] * d * d;
        }
        var /= n;
        if (training == 1 && running_mean) { // 2: the batch's, the running ones left alone
          running_mean[c] = (T(1) - momentum) * running_mean[c] + momentum * T(mean);
          const T unbiased = T(n > 1 ? var * n / (n - 1) : var);
          running_var[c] = (T(1) - momentum) * running_var[c] + momentum * unbiased;
          if (c == 0 && tracked)
            tracked[0] += T(1);
        }
        stats[2 * c] = T(mean);
        stats[2 * c + 1] = T(1) / sqrt(T(var) + eps);
      });
}

template <class On, class T>
void batch_norm_apply(On on, T* out, const T* inp, const T* stats, const T* weight, const T* bias,
                      long B, int C, long S) {
  each_index(
      on, B * C * S, ROOTCLAD_BODY(long i) {
        const long c = i / S % C;
        const T y = (inp[i] - stats[2 * c]) * stats[2 * c + 1];
        out[i] = (weight ? weight[c] : T(1)) * y + (bias ? bias[c] : T(0));
      });
}

template <class On, class T>
void batch_norm_backward_reduce(On on, T* stats, T* d_weight, T* d_bias, const T* d_out,
                                const T* inp, long B, int C, long S) {
  const long chunks = bn_chunks(B);
  T* part = stats + 4 * C;
  each_index(
      on, C * chunks, ROOTCLAD_BODY(long i) {
        const long c = i / chunks, k = i % chunks;
        T sum_dy = 0, sum_dy_xhat = 0;
        for (long b = B * k / chunks; b < B * (k + 1) / chunks; ++b)
          for (long s = 0; s < S; ++s) {
            const long at = (b * C + c) * S + s;
            sum_dy += d_out[at];
            sum_dy_xhat += d_out[at] * (inp[at] - stats[2 * c]) * stats[2 * c + 1];
          }
        part[3 * i] = sum_dy;
        part[3 * i + 1] = sum_dy_xhat;
      });
  each_index(
      on, (long)C, ROOTCLAD_BODY(long c) {
        T sum_dy = 0, sum_dy_xhat = 0;
        for (long k = 0; k < chunks; ++k) {
          sum_dy += part[3 * (c * chunks + k)];
          sum_dy_xhat += part[3 * (c * chunks + k) + 1];
        }
        stats[2 * C + 2 * c] = sum_dy;
        stats[2 * C + 2 * c + 1] = sum_dy_xhat;
        if (d_bias)
          d_bias[c] += sum_dy;
        if (d_weight)
          d_weight[c] += sum_dy_xhat;
      });
}

template <class On, class T>
void batch_norm_backward_input(On on, T* d_inp, const T* d_out, const T* inp, const T* stats,
                               const T* weight, long B, int C, long S, int training) {
  const T n = T(B * S);
  each_index(
      on, B * C * S, ROOTCLAD_BODY(long i) {
        const long c = i / S % C;
        const T scale = (weight ? weight[c] : T(1)) * stats[2 * c + 1];
        T g = d_out[i];
        if (training) {
          const T xhat = (inp[i] - stats[2 * c]) * stats[2 * c + 1];
          g -= (stats[2 * C + 2 * c] + xhat * stats[2 * C + 2 * c + 1]) / n;
        }
        d_inp[i] += scale * g;
      });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_NORM_IMPL_H
