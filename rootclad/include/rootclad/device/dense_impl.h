// rootclad/device/dense_impl.h — the definitions of the device kernels device/dense.h declares
// (its comments say what each computes), and the helpers they share.
#ifndef ROOTCLAD_DEVICE_DENSE_IMPL_H
#define ROOTCLAD_DEVICE_DENSE_IMPL_H

#include "dense.h"

namespace rootclad {
namespace dev {

// Linear: from GEMM_MIN_ROWS rows on, the products go to gemm (cuBLAS on the GPU, device_gemm.h);
// fewer rows run as one loop kernel each, which costs less than a GEMM call there.
constexpr int GEMM_MIN_ROWS = 32;

// out = act(out + bias) (bias: null for none), after a product
template <class On, class T, class Act>
void bias_act(On on, T* out, const T* bias, long R, int OC, Act act) {
  each_index(
      on, R * OC, ROOTCLAD_BODY(long i) { out[i] = act.f(out[i] + (bias ? bias[i % OC] : T(0))); });
}

template <class On, class T, class Act>
void linear_forward(On on, T* out, const T* inp, const T* weight, const T* bias, int R, int C,
                    int OC, Act act) {
  if (R >= GEMM_MIN_ROWS) {
    gemm(on, false, true, R, OC, C, T(1), inp, C, weight, C, T(0), out, OC);
    if (bias || !std::is_same<Act, NoAct>::value)
      bias_act(on, out, bias, R, OC, act);
    return;
  }
  each_index(
      on, (long)R * OC, ROOTCLAD_BODY(long i) {
        const long r = i / OC;
        const int o = (int)(i % OC);
        T s = bias ? bias[o] : T(0);
        for (int c = 0; c < C; ++c)
          s += inp[r * C + c] * weight[(long)o * C + c];
        out[i] = act.f(s);
      });
}

// d_inp(R, C) += d_out @ weight, as loops
template <class On, class T, class DY>
void linear_backward_input(On on, T* d_inp, DY d_out, const T* weight, int R, int C, int OC) {
  each_index(
      on, (long)R * C, ROOTCLAD_BODY(long i) {
        const long r = i / C;
        const int c = (int)(i % C);
        T s = 0;
        for (int o = 0; o < OC; ++o)
          s += d_out[r * OC + o] * weight[(long)o * C + c];
        d_inp[i] += s;
      });
}

// d_weight(OC, C) += d_out^T @ inp;  d_bias(OC) += column sums of d_out (null: skipped), as
// loops
template <class On, class T, class DY>
void linear_backward_params(On on, T* d_weight, T* d_bias, DY d_out, const T* inp, int R, int C,
                            int OC) {
  if (d_weight) // null: not wanted (an input gradient)
    each_index(
        on, (long)OC * C, ROOTCLAD_BODY(long i) {
          const int o = (int)(i / C);
          const int c = (int)(i % C);
          T s = 0;
          for (long r = 0; r < R; ++r)
            s += d_out[r * OC + o] * inp[r * C + c];
          d_weight[i] += s;
        });
  if (d_bias)
    bias_backward(on, d_bias, d_out, R, OC, 1);
}

template <class On, class T, class DY>
void linear_backward(On on, T* d_inp, T* d_weight, T* d_bias, DY d_out, const T* inp,
                     const T* weight, int R, int C, int OC) {
  if (R < GEMM_MIN_ROWS) {
    linear_backward_params(on, d_weight, d_bias, d_out, inp, R, C, OC);
    if (d_inp)
      linear_backward_input(on, d_inp, d_out, weight, R, C, OC);
    return;
  }
  const T* dy = as_matrix(on, d_out, (long)R * OC);
  if (d_weight)
    gemm(on, true, false, OC, C, R, T(1), dy, OC, inp, C, T(1), d_weight, C);
  if (d_bias)
    bias_backward(on, d_bias, dy, R, OC, 1);
  if (d_inp)
    gemm(on, false, false, R, C, OC, T(1), dy, OC, weight, C, T(1), d_inp, C);
}

// The distance between the operand's matrices of products t and t + 1 (t = s G + g), for an
// operand of n values per sample and group stride st; -1 where it is shared by its sample's G
// products (no one distance).
inline long matmul_stride(int G, long n, long st) {
  return G == 1 ? n : (st != 0 && n == G * st ? st : -1);
}

template <class On, class T>
void matmul_forward(On on, T* out, const T* a, const T* b, long B, Matmul g) {
  const long ta = matmul_stride(g.G, g.na, g.sa), tb = matmul_stride(g.G, g.nb, g.sb);
  if (ta > 0 && tb > 0 && B * g.G <= 2147483647L) // cuBLAS counts products in an int
    return gemm_batched(on, false, false, g.M, g.N, g.K, T(1), a, g.K, ta, b, g.N, tb, T(0), out,
                        g.N, (long)g.M * g.N, (int)(B * g.G));
  each_index(
      on, B * g.G * g.M * g.N, ROOTCLAD_BODY(long i) {
        const long mn = (long)g.M * g.N, s = i / (g.G * mn), grp = i / mn % g.G;
        const long r = i / g.N % g.M, c = i % g.N;
        const T* pa = a + s * g.na + grp * g.sa + r * g.K;
        const T* pb = b + s * g.nb + grp * g.sb + c;
        T acc = 0;
        for (int k = 0; k < g.K; ++k)
          acc += pa[k] * pb[(long)k * g.N];
        out[i] = acc;
      });
}

template <class On, class T>
void matmul_backward_a(On on, T* d_a, const T* d_out, const T* b, long B, Matmul g) {
  const long ta = matmul_stride(g.G, g.na, g.sa), tb = matmul_stride(g.G, g.nb, g.sb);
  if (ta > 0 && tb > 0 && B * g.G <= 2147483647L) // cuBLAS counts products in an int
    return gemm_batched(on, false, true, g.M, g.K, g.N, T(1), d_out, g.N, (long)g.M * g.N, b, g.N,
                        tb, T(1), d_a, g.K, ta, (int)(B * g.G));
  each_index(
      on, B * g.na, ROOTCLAD_BODY(long i) {
        const long s = i / g.na, e = i % g.na;
        const long g0 = g.sa ? e / g.sa : 0, g1 = g.sa ? g0 + 1 : g.G, rest = g.sa ? e % g.sa : e;
        const long r = rest / g.K, k = rest % g.K;
        T acc = 0;
        for (long grp = g0; grp < g1; ++grp) {
          const T* dy = d_out + ((s * g.G + grp) * g.M + r) * g.N;
          const T* pb = b + s * g.nb + grp * g.sb + k * g.N;
          for (int c = 0; c < g.N; ++c)
            acc += dy[c] * pb[c];
        }
        d_a[i] += acc;
      });
}

template <class On, class T>
void matmul_backward_b(On on, T* d_b, const T* d_out, const T* a, long B, Matmul g) {
  const long ta = matmul_stride(g.G, g.na, g.sa), tb = matmul_stride(g.G, g.nb, g.sb);
  if (ta > 0 && tb > 0 && B * g.G <= 2147483647L) // cuBLAS counts products in an int
    return gemm_batched(on, true, false, g.K, g.N, g.M, T(1), a, g.K, ta, d_out, g.N,
                        (long)g.M * g.N, T(1), d_b, g.N, tb, (int)(B * g.G));
  each_index(
      on, B * g.nb, ROOTCLAD_BODY(long i) {
        const long s = i / g.nb, e = i % g.nb;
        const long g0 = g.sb ? e / g.sb : 0, g1 = g.sb ? g0 + 1 : g.G, rest = g.sb ? e % g.sb : e;
        const long k = rest / g.N, c = rest % g.N;
        T acc = 0;
        for (long grp = g0; grp < g1; ++grp)
          for (int r = 0; r < g.M; ++r)
            acc += a[s * g.na + grp * g.sa + (long)r * g.K + k] *
                   d_out[((s * g.G + grp) * g.M + r) * g.N + c];
        d_b[i] += acc;
      });
}

template <class On, class T>
void embedding_forward(On on, T* out, const T* idx, const T* w, long n, int V, int D) {
  each_index(
      on, n * D, ROOTCLAD_BODY(long k) {
        const T v = idx[k / D];
        out[k] = v >= T(0) && v < T(V) ? w[(long)v * D + k % D] : T(NAN);
      });
}

template <class On, class T>
void embedding_backward(On on, T* d_w, const T* d_out, const T* idx, long n, int V, int D,
                        int pad) {
  each_index(
      on, n * D, ROOTCLAD_BODY(long k) {
        const T v = idx[k / D];
        if (v >= T(0) && v < T(V) && (long)v != pad)
          add_to(d_w + (long)v * D + k % D, d_out[k]);
      });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_DENSE_IMPL_H
