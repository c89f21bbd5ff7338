// rootclad/device/norm.h — Softmax, LayerNorm and BatchNorm as device kernels (device_kernels.h
// says how they are written).
#ifndef ROOTCLAD_DEVICE_NORM_H
#define ROOTCLAD_DEVICE_NORM_H

#include "core.h"

namespace rootclad {
namespace dev {

// -- softmax and log-softmax along the middle axis of inp(R, N, S): one line (r, s) per index --
// log_form: 0 softmax, 1 log-softmax, 2 safe softmax (a line of all -inf gives 0s: ops/norm.h)
template <class On, class T>
void softmax_forward(On on, T* out, const T* inp, long R, int N, int S, int log_form);

// softmax (and safe): d_x += y (d_y - sum d_y y); log-softmax: d_x += d_y - exp(y) sum d_y
template <class On, class T>
void softmax_backward(On on, T* d_inp, const T* d_out, const T* out, long R, int N, int S,
                      int log_form);

// -- LayerNorm over the rows of inp(R, M); stats (2R): each row's mean and 1/std --------------
template <class On, class T>
void layer_norm_forward(On on, T* out, T* stats, const T* inp, const T* weight, const T* bias,
                        long R, int M, T eps);

// d_weight[i] += sum over rows of d_out x_hat, d_bias[i] += sum of d_out (null: skipped); the
// rows split into chunks (batch_chunks: a transformer's 2^15 rows for 256 values were 256
// threads of 2^15 steps, 39 of its 67 ms on an H200)
template <class On, class T>
void layer_norm_backward_params(On on, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                                const T* stats, long R, int M);

// d_x += 1/std (g - mean(g) - x_hat mean(g x_hat)), g = d_out * weight, per row
template <class On, class T>
void layer_norm_backward_input(On on, T* d_inp, const T* d_out, const T* inp, const T* stats,
                               const T* weight, long R, int M);

// -- BatchNorm over inp(B, C, S) per channel c ------------------------------------------------
// stats: mean and 1/std per channel at [2c, 2c + 1], the backward's sums at [2C + 2c, 2C + 2c +
// 1], then per channel and chunk of the batch (BN_CHUNKS at most) a partial result at
// 4C + 3 (c chunks + k). Training (or no running statistics): the batch's, each chunk's count,
// mean and squared deviations (two passes, in double) combined per channel as Chan et al.'s
// parallel variance, updating the running ones as torch (unbiased variance,
// num_batches_tracked + 1); eval: the running ones.
constexpr int BN_CHUNKS = 64;

template <class On, class T>
void batch_norm_stats(On on, T* stats, const T* inp, T* running_mean, T* running_var, T* tracked,
                      long B, int C, long S, T eps, T momentum, int training);

// out = (inp - mean) / std * weight + bias (weight, bias: null for 1 and 0)
template <class On, class T>
void batch_norm_apply(On on, T* out, const T* inp, const T* stats, const T* weight, const T* bias,
                      long B, int C, long S);

// per channel: sum d_out and sum d_out * x_hat into stats[2C + 2c, 2C + 2c + 1], which are
// d_bias and d_weight (added when not null); each chunk of the batch sums its part first
template <class On, class T>
void batch_norm_backward_reduce(On on, T* stats, T* d_weight, T* d_bias, const T* d_out,
                                const T* inp, long B, int C, long S);

// training: d_inp += w/std * (dy - mean(dy) - x_hat * mean(dy x_hat)), the means over the
// channel's B*S values (the statistics depend on the input); eval: d_inp += w/std * dy
template <class On, class T>
void batch_norm_backward_input(On on, T* d_inp, const T* d_out, const T* inp, const T* stats,
                               const T* weight, long B, int C, long S, int training);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "norm_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_NORM_H
