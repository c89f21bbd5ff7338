// rootclad/device/conv.h — Conv2d (and Conv1d as H = 1), direct and as products, and ConvTranspose
// as device kernels
// (device_kernels.h says how they are written).
#ifndef ROOTCLAD_DEVICE_CONV_H
#define ROOTCLAD_DEVICE_CONV_H

#include "core.h"

namespace rootclad {
namespace dev {

// -- Conv2d (Conv1d: H = KH = 1): out(B, OC, OH, OW) from inp(B, C, H, W) and
// weight(OC, C/G, KH, KW), any stride, zero padding, dilation and G groups -----------------------
struct Conv {
  int C, H, W, OC, KH, KW, SH, SW, PH, PW, DH, DW, G, OH, OW;
};

inline ROOTCLAD_HD int conv_out_len(int L, int K, int S, int P, int D) {
  return (L + 2 * P - D * (K - 1) - 1) / S + 1;
}

inline Conv conv2d_shape(int C, int H, int W, int OC, int KH, int KW, int SH, int SW, int PH,
                         int PW, int DH, int DW, int G) {
  return Conv{C,
              H,
              W,
              OC,
              KH,
              KW,
              SH,
              SW,
              PH,
              PW,
              DH,
              DW,
              G,
              conv_out_len(H, KH, SH, PH, DH),
              conv_out_len(W, KW, SW, PW, DW)};
}

inline Conv conv1d_shape(int C, int L, int OC, int K, int S, int P, int D, int G = 1) {
  return conv2d_shape(C, 1, L, OC, 1, K, 1, S, 0, P, 1, D, G);
}

// -- Conv2d as products (one group): the columns col(CK, N) hold, for each of the N = Bc x OH x OW
// output positions of a chunk of Bc samples (sample-major) and each of the CK = C x KH x KW taps,
// the input element it reads (im2col); then out = weight(OC, CK) @ col, d_weight += d_out @
// col^T and d_col = weight^T @ d_out, whose columns are summed back onto the input (col2im), each
// a single gemm (cuBLAS on the GPU) per chunk. The products are (OC, N), channel-major, so the
// output and its adjoint pass through a reordering copy in the workspace, which the bias, the
// fused activation and its derivative ride along with. Taken from CONV_GEMM_MIN_COLUMNS output
// positions over the batch on; fewer run as the direct kernels (fewer launches: 3 forward and up
// to 6 backward against 1 and 3). A chunk holds at most CONV_GEMM_MAX_COLUMNS output positions
// (whole samples, at least one), so the workspace stays bounded at any batch size. The program
// gives a layer a workspace only where its depth makes products pay (ops.CONV_GEMM_MIN_DEPTH).
constexpr long CONV_GEMM_MIN_COLUMNS = 4096;

#ifndef ROOTCLAD_CONV_GEMM_MAX_COLUMNS // a test sets it low to run many chunks
#define ROOTCLAD_CONV_GEMM_MAX_COLUMNS (1L << 17)
#endif

constexpr long CONV_GEMM_MAX_COLUMNS = ROOTCLAD_CONV_GEMM_MAX_COLUMNS;

inline ROOTCLAD_HD long conv_depth(Conv g) {
  return (long)(g.C / g.G) * g.KH * g.KW;
}

inline bool conv_gemm_applies(int B, Conv g) {
  return g.G == 1 && (long)B * g.OH * g.OW >= CONV_GEMM_MIN_COLUMNS;
}

// the samples per chunk of products
inline int conv_gemm_chunk(int B, Conv g) {
  const long fit = CONV_GEMM_MAX_COLUMNS / ((long)g.OH * g.OW);
  return (int)(fit < 1 ? 1 : fit < B ? fit : B);
}

// the workspace (values) a layer uses at batch B: a chunk's columns (CK x N), then its
// channel-major output or output adjoint (OC x N); none where it runs directly
inline long conv_gemm_workspace(int B, Conv g) {
  if (!conv_gemm_applies(B, g))
    return 0;
  return (conv_depth(g) + g.OC) * g.OH * g.OW * conv_gemm_chunk(B, g);
}

// out = conv(inp) + bias, through act; with a workspace (`work`, conv_gemm_workspace(B, g)
// values) and enough output positions over the batch, as products (conv_gemm_applies)
template <class On, class T, class Act = NoAct>
void conv2d_forward(On on, T* out, const T* inp, const T* weight, const T* bias, int B, Conv g,
                    Act act = {}, T* work = nullptr);

// The whole pullback: d_inp (null: not wanted), d_weight and d_bias (null: skipped); through
// gemm where the forward went so (a workspace, conv_gemm_applies)
template <class On, class T, class DY>
void conv2d_backward(On on, T* d_inp, T* d_weight, T* d_bias, DY d_out, const T* inp,
                     const T* weight, int B, Conv g, T* work = nullptr);

// -- ConvTranspose2d (ConvTranspose1d: H = KH = 1): the input gradient of the convolution g
// from (g.C, g.H, g.W) to (g.OC, g.OH, g.OW): inp(B, g.OC, g.OH, g.OW) -> out(B, g.C, g.H, g.W),
// weight(g.OC, g.C/G, KH, KW) as torch's; its backward is g's forward ----------------------------
template <class On, class T>
void conv_transpose2d_forward(On on, T* out, const T* inp, const T* weight, const T* bias, int B,
                              Conv g);

// d_inp(B, g.OC, g.OH, g.OW) += conv_g(d_out)
template <class On, class T>
void conv_transpose2d_backward_input(On on, T* d_inp, const T* d_out, const T* weight, int B,
                                     Conv g);

// d_weight += g's weight gradient with the roles of input and output adjoint exchanged;
// d_bias[c] += sum of d_out[b, c, ...] (null: skipped)
template <class On, class T>
void conv_transpose2d_backward_params(On on, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                                      int B, Conv g);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "conv_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_CONV_H
