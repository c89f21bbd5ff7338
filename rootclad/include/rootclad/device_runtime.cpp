// rootclad/device_runtime.cpp — the device runtime library: every device kernel
// (device_kernels.h) for float and double, for one executor, compiled once into the cache
// (rootclad/toolchain/recipes.py: device_runtime): as host loops by the C++ compiler (dev::Host),
// or for one GPU architecture by nvcc (dev::Cuda; this file is then compiled as CUDA). A model's
// device program declares the kernels only (ROOTCLAD_DECLARATIONS_ONLY) and links against
// this library, so its build compiles its own launches and nothing else, with the host
// compiler for either executor.
//
// The kernels templated on more than On and T are kept for what a program can pass:
// - each elementwise functor of the op registry (ops/activations.h's lists) through the
//   unary and parametric kernels;
// - NoAct and each activation a producer can fuse (ROOTCLAD_FUSABLE_ACTIVATIONS: its grad reads
//   y alone) through the fusing kernels, whose backward reads the adjoint as T* or through it
//   (ActGrad);
// - each elementwise loss functor (ROOTCLAD_DEVICE_LOSSES) through loss_and_gradient.
// tests/cuda/test_device_runtime.py checks these lists against the registry and codegen/cuda*.py,
// and the library's symbols against them.
//
// The library is built in ROOTCLAD_DEVICE_PARTS translation units (-DROOTCLAD_DEVICE_PART=k,
// built side by side; all of them without it), so that no one compile holds every kernel.
#include "device_kernels.h"

#define ROOTCLAD_DEVICE_PARTS 5
#ifndef ROOTCLAD_DEVICE_PART
#define ROOTCLAD_DEVICE_PART -1
#endif

// clang-format off
// kernels over <On, T>, by part
#define ROOTCLAD_DEVICE_KERNELS_0(X)                                                               \
  X(fill) X(zero) X(copy) X(matmul_forward) X(matmul_backward_a) X(matmul_backward_b)              \
  X(embedding_forward) X(embedding_backward) X(dropout_forward) X(dropout_backward)                \
  X(sample_dropout_forward) X(sample_dropout_backward) X(normal_forward) X(cross_entropy_forward)  \
  X(cross_entropy_backward) X(nll_forward) X(nll_backward) X(optim_step) X(optim_step_in_memory)   \
  X(cdist_forward) X(cdist_backward_a) X(cdist_backward_b)
#define ROOTCLAD_DEVICE_KERNELS_3(X)                                                               \
  X(conv_transpose2d_forward) X(conv_transpose2d_backward_input)                                   \
  X(conv_transpose2d_backward_params) X(conv3d_forward) X(conv3d_backward_input)                   \
  X(conv3d_backward_params) X(maxpool3d_forward) X(maxpool3d_backward) X(avgpool3d_forward)        \
  X(avgpool3d_backward)
#define ROOTCLAD_DEVICE_KERNELS_4(X)                                                               \
  X(adaptive_maxpool_forward) X(adaptive_avgpool_forward) X(adaptive_pool_backward)                \
  X(global_maxpool_forward) X(global_maxpool_backward) X(amax_forward) X(amax_backward)            \
  X(global_avgpool_forward) X(global_avgpool_backward) X(upsample_forward) X(upsample_backward)    \
  X(softmax_forward) X(softmax_backward) X(layer_norm_forward) X(layer_norm_backward_params)       \
  X(layer_norm_backward_input) X(batch_norm_stats) X(batch_norm_apply)                             \
  X(batch_norm_backward_reduce) X(batch_norm_backward_input) X(permute_forward)                    \
  X(permute_backward) X(cat_part_forward) X(cat_part_backward) X(slice_forward) X(slice_backward)  \
  X(pad_forward) X(pad_backward) X(parameter_forward) X(parameter_backward) X(expand_forward)       \
  X(expand_backward) X(topk_forward) X(gather_forward) X(gather_backward)
// kernels that apply an activation as they write (<name>_forward over <On, T, Act>) and their
// backward (<name>_backward over <On, T, DY>), by part
#define ROOTCLAD_DEVICE_FUSING_2(X) X(linear) X(add) X(binary)
#define ROOTCLAD_DEVICE_FUSING_3(X) X(conv2d)
#define ROOTCLAD_DEVICE_FUSING_4(X) X(maxpool2d) X(avgpool2d)
// the activations a producer can fuse: the functors whose grad reads y alone
#define ROOTCLAD_FUSABLE_ACTIVATIONS(X) X(Relu) X(Tanh) X(Sigmoid) X(Exp) X(Sqrt) X(Rsqrt) X(Reciprocal)
// the elementwise losses' functors (device/loss.h)
#define ROOTCLAD_DEVICE_LOSSES(X) X(BceWithLogits) X(Mse) X(Huber)
// clang-format on

// the parts this translation unit compiles: ROOTCLAD_PART_k(...) keeps its arguments in part k
#define ROOTCLAD_IN_PART(k) (ROOTCLAD_DEVICE_PART < 0 || ROOTCLAD_DEVICE_PART == k)
#if ROOTCLAD_IN_PART(0)
#define ROOTCLAD_PART_0(...) __VA_ARGS__
#else
#define ROOTCLAD_PART_0(...)
#endif
#if ROOTCLAD_IN_PART(1)
#define ROOTCLAD_PART_1(...) __VA_ARGS__
#else
#define ROOTCLAD_PART_1(...)
#endif
#if ROOTCLAD_IN_PART(2)
#define ROOTCLAD_PART_2(...) __VA_ARGS__
#else
#define ROOTCLAD_PART_2(...)
#endif
#if ROOTCLAD_IN_PART(3)
#define ROOTCLAD_PART_3(...) __VA_ARGS__
#else
#define ROOTCLAD_PART_3(...)
#endif
#if ROOTCLAD_IN_PART(4)
#define ROOTCLAD_PART_4(...) __VA_ARGS__
#else
#define ROOTCLAD_PART_4(...)
#endif

namespace rootclad {
namespace dev {
#if defined(__CUDACC__)
using Executor = Cuda;
#else
using Executor = Host;
#endif

// Taking a kernel's address instantiates it here; the library's version script exports every
// rootclad::dev symbol, under a version named after the library's key, so that a program binds
// to the library it was built against.
#define ROOTCLAD_KEEP(f) (void*)&f<Executor, T>,
#define ROOTCLAD_KEEP_FUSING(f)                                                                    \
  (void*)&f##_forward<Executor, T, Act>, (void*)&f##_backward<Executor, T, DY>,

template <class T> void* const* kernels() {
  static void* const kept[] = {
      ROOTCLAD_PART_0(ROOTCLAD_DEVICE_KERNELS_0(ROOTCLAD_KEEP))
          ROOTCLAD_PART_3(ROOTCLAD_DEVICE_KERNELS_3(ROOTCLAD_KEEP))
              ROOTCLAD_PART_4(ROOTCLAD_DEVICE_KERNELS_4(ROOTCLAD_KEEP)) nullptr};
  return kept;
}

// the fusing kernels for one activation (NoAct: none; the adjoint then a plain pointer)
template <class T, class Act> void* const* fusing() {
  using DY = typename std::conditional<std::is_same<Act, NoAct>::value, T*, ActGrad<T, Act>>::type;
  static void* const kept[] = {
      ROOTCLAD_PART_2(ROOTCLAD_DEVICE_FUSING_2(ROOTCLAD_KEEP_FUSING))
          ROOTCLAD_PART_3(ROOTCLAD_DEVICE_FUSING_3(ROOTCLAD_KEEP_FUSING))
              ROOTCLAD_PART_4(ROOTCLAD_DEVICE_FUSING_4(ROOTCLAD_KEEP_FUSING)) nullptr};
  return kept;
}

// the elementwise kernels for one functor: without and with a parameter per channel (whose
// adjoint the program passes as a pointer)
template <class T, class Op> void* const* unary() {
  static void* const kept[] = {(void*)&unary_forward<Executor, T, Op>,
                               (void*)&unary_backward<Executor, T, Op>, nullptr};
  return kept;
}
template <class T, class Op> void* const* parametric() {
  static void* const kept[] = {(void*)&parametric_forward<Executor, T, Op>,
                               (void*)&parametric_backward_input<Executor, T, T*, Op>,
                               (void*)&parametric_backward_param<Executor, T, T*, Op>, nullptr};
  return kept;
}

template <class T, class L> void* const* loss() {
  static void* const kept[] = {(void*)&loss_and_gradient<Executor, T, L>, nullptr};
  return kept;
}

#define ROOTCLAD_BOTH(f, X) (void*)&f<float, X>, (void*)&f<double, X>,
#define ROOTCLAD_KEEP_ACT(A) ROOTCLAD_BOTH(fusing, ::rootclad::A)
#define ROOTCLAD_KEEP_UNARY(F) ROOTCLAD_BOTH(unary, ::rootclad::F)
#define ROOTCLAD_KEEP_PARAMETRIC(F) ROOTCLAD_BOTH(parametric, ::rootclad::F)
#define ROOTCLAD_KEEP_LOSS(L) ROOTCLAD_BOTH(loss, L)
#if ROOTCLAD_DEVICE_PART < 0 || ROOTCLAD_DEVICE_PART >= 2
#define ROOTCLAD_FUSING_PARTS(...) __VA_ARGS__
#else
#define ROOTCLAD_FUSING_PARTS(...)
#endif

// The table of them all, which the linker keeps (nothing reads it)
// clang-format off
__attribute__((used)) static void* const kept[] = {
    (void*)&kernels<float>, (void*)&kernels<double>,
    ROOTCLAD_PART_0((void*)&launch_status<Executor>, (void*)&error_text<Executor>,
                    ROOTCLAD_DEVICE_LOSSES(ROOTCLAD_KEEP_LOSS))
    ROOTCLAD_PART_1(ROOTCLAD_UNARY_FUNCTORS(ROOTCLAD_KEEP_UNARY)
                    ROOTCLAD_PARAMETRIC_FUNCTORS(ROOTCLAD_KEEP_PARAMETRIC))
    ROOTCLAD_FUSING_PARTS(ROOTCLAD_BOTH(fusing, NoAct)
                          ROOTCLAD_FUSABLE_ACTIVATIONS(ROOTCLAD_KEEP_ACT))
#if !defined(__CUDACC__) && ROOTCLAD_IN_PART(0) // the host counts the launches a GPU would make
    (void*)&launch_count<Executor>,
#endif
    nullptr};
// clang-format on

} // namespace dev
} // namespace rootclad
