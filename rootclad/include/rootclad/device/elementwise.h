// rootclad/device/elementwise.h — the elementwise ops and Dropout as device kernels
// (device_kernels.h says how they are written).
#ifndef ROOTCLAD_DEVICE_ELEMENTWISE_H
#define ROOTCLAD_DEVICE_ELEMENTWISE_H

#include "core.h"

namespace rootclad {
namespace dev {

// -- elementwise ops: the functors of ops/activations.h, written once for every backend; those
// whose grad reads y alone (Relu, Tanh, Sigmoid) can be fused into their producer -------------
template <class On, class T, class Op>
void unary_forward(On on, T* out, const T* inp, long n, Op op);

// d_inp += the functor's grad: d_out times f'(x), from x or y
template <class On, class T, class Op>
void unary_backward(On on, T* d_inp, const T* d_out, const T* inp, const T* out, long n, Op op);

// -- elementwise ops with a parameter per channel (PReLU): inp(B, C, S), a(A), A = C or 1 -------
template <class On, class T, class Op>
void parametric_forward(On on, T* out, const T* inp, const T* a, long B, int C, long S, int A,
                        Op op);

// d_inp += the functor's grad
template <class On, class T, class DY, class Op>
void parametric_backward_input(On on, T* d_inp, DY d_out, const T* inp, const T* out, const T* a,
                               long B, int C, long S, int A, Op op);

// d_a[p] += the functor's param_grad over the batch and the positions p reads, each sum split
// into chunks of the batch (batch_chunks)
template <class On, class T, class DY, class Op>
void parametric_backward_param(On on, T* d_a, DY d_out, const T* inp, const T* out, const T* a,
                               long B, int C, long S, int A, Op op);

// -- Dropout: the CPU's mask (dropout_mask.h) for the element's index in the batch; p = 0 (eval
// mode) keeps every element -------------------------------------------------------------------
template <class On, class T>
void dropout_forward(On on, T* out, const T* inp, long n, T p, std::uint64_t seed);

template <class On, class T>
void dropout_backward(On on, T* d_inp, const T* d_out, long n, T p, std::uint64_t seed);

// -- torch.randn_like: the CPU's draw (dropout_mask.h's normal_draw) for the element's index in
// the batch ----------------------------------------------------------------------------------
template <class On, class T> void normal_forward(On on, T* out, long n, std::uint64_t seed);

// -- Stochastic depth: the CPU's mask for the sample's index in the batch (each sample `per`
// values), or index 0 for all (whole_batch) ---------------------------------------------------
template <class On, class T>
void sample_dropout_forward(On on, T* out, const T* inp, long n, long per, T p, std::uint64_t seed,
                            int whole_batch);

template <class On, class T>
void sample_dropout_backward(On on, T* d_inp, const T* d_out, long n, long per, T p,
                             std::uint64_t seed, int whole_batch);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "elementwise_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_ELEMENTWISE_H
