// Every device kernel instantiated for the GPU, float and double: tests/cuda/ compiles this
// with nvcc wherever nvcc is installed, GPU or not. test_functors.h (test_nvcc.py writes it)
// defines ROOTCLAD_TEST_FUNCTORS and ROOTCLAD_TEST_PARAMETRIC: every elementwise functor of the
// op registry, without and with a parameter per channel.
#include <rootclad/device_kernels.h>

#include "test_functors.h"

using rootclad::dev::Cuda;
namespace k = rootclad::dev;

template <class T, class... Op> void unary(Cuda on, Op... op) {
  T* p = nullptr;
  (k::unary_forward(on, p, p, 1, op), ...);
  (k::unary_backward(on, p, p, p, p, 1, op), ...);
}

template <class T, class... Op> void parametric(Cuda on, Op... op) {
  T* p = nullptr;
  (k::parametric_forward(on, p, p, p, 1, 1, 1, 1, op), ...);
  (k::parametric_backward_input(on, p, p, p, p, p, 1, 1, 1, 1, op), ...);
  (k::parametric_backward_param(on, p, p, p, p, p, 1, 1, 1, 1, op), ...);
}

template <class T> void instantiate() {
  Cuda on{};
  T* p = nullptr;
  k::fill(on, p, 1, T(0));
  k::zero(on, p, 1, p, 1, p, 1);
  k::copy(on, p, p, 1);
  k::linear_forward(on, p, p, p, p, 1, 1, 1);
  k::linear_backward_input(on, p, p, p, 1, 1, 1);
  k::linear_backward_params(on, p, p, p, p, 1, 1, 1);
  const k::Matmul mm{2, 3, 4, 5, 24, 12, 20, 0};
  k::matmul_forward(on, p, p, p, 1, mm);
  k::matmul_backward_a(on, p, p, p, 1, mm);
  k::matmul_backward_b(on, p, p, p, 1, mm);
  const k::Upsample<T> up{2, 3, 5, 7, 1, T(0.4), T(0.43)};
  k::upsample_forward(on, p, p, 1, up);
  k::upsample_backward(on, p, p, 1, up);
  k::as_matrix(on, k::act_grad(p, p, rootclad::Relu{}), 1);
  // every elementwise functor of the registry (test_nvcc.py passes the list)
  unary<T>(on, ROOTCLAD_TEST_FUNCTORS);
  parametric<T>(on, ROOTCLAD_TEST_PARAMETRIC);
  k::add_forward(on, p, p, p, 1, T(1));
  k::add_backward(on, p, p, 1, T(1));
  const k::Broadcast bc{{1, 2, 3}, {0, 3, 1}, {6, 3, 1}, 3, 6};
  k::binary_forward(on, p, p, p, 1, bc, 2);
  k::binary_backward(on, p, p, p, p, 1, bc, 2, 0);
  k::causal_fill_forward(on, p, p, 1, 2, 2, 0);
  k::causal_fill_backward(on, p, p, 1, 2, 2, 0);
  const rootclad::Win win{2, 2, 2, 2, 1, 1, 1};
  k::window_bias_forward(on, p, p, p, 1, win);
  k::window_bias_backward(on, p, p, p, 1, win);
  k::dropout_forward(on, p, p, 1, T(0.5), 1ull);
  k::dropout_backward(on, p, p, 1, T(0.5), 1ull);
  const k::Permute perm{{1, 1, 3, 2}, {0, 0, 1, 3}, 6};
  k::permute_forward(on, p, p, 1, perm);
  k::permute_backward(on, p, p, 1, perm);
  k::cat_part_forward(on, p, p, 1, 2, 3, 1);
  k::cat_part_backward(on, p, p, 1, 2, 3, 1);
  const k::Slice slice{4, 2, 3, 1, 2};
  k::slice_forward(on, p, p, 1, slice);
  k::slice_backward(on, p, p, 1, slice);
  const k::Pad pad{2, 4, 3, 1};
  k::pad_forward(on, p, p, 1, pad, T(0));
  k::pad_backward(on, p, p, 1, pad);
  k::parameter_forward(on, p, p, 1, 1);
  k::parameter_backward(on, p, p, 1, 1);
  k::embedding_forward(on, p, p, p, 1L, 2, 3);
  k::embedding_backward(on, p, p, p, 1L, 2, 3, -1);
  const rootclad::Vol vol{2, 3, 3, 1, 2, 2, 2, 2, 2, 1, 1, 1, 0, 0, 0, 1, 1, 1};
  k::conv3d_forward(on, p, p, p, p, 1, 2, 2, 1, vol);
  k::conv3d_backward_input(on, p, p, p, 1, 2, 2, 1, vol);
  k::conv3d_backward_params(on, p, p, p, p, 1, 2, 2, 1, vol);
  k::maxpool3d_forward(on, p, p, 1, vol);
  k::maxpool3d_backward(on, p, p, p, 1, vol);
  k::avgpool3d_forward(on, p, p, 1, 1, vol);
  k::avgpool3d_backward(on, p, p, 1, 1, vol);
  const k::Expand expand{{1, 2, 3}, {0, 3, 1}, 6};
  k::expand_forward(on, p, p, 1, expand);
  k::expand_backward(on, p, p, 1, expand);
  k::topk_forward(on, p, p, 1, 4, 2, 1, 1);
  k::gather_forward(on, p, p, p, 1, 4, 2, 1);
  k::gather_backward(on, p, p, p, 1, 4, 2, 1);
  k::sample_dropout_forward(on, p, p, 1, 1, T(0.5), 1ull, 0);
  k::sample_dropout_backward(on, p, p, 1, 1, T(0.5), 1ull, 0);
  k::softmax_forward(on, p, p, 1, 2, 1, 0);
  k::softmax_backward(on, p, p, p, 1, 2, 1, 1);
  k::layer_norm_forward(on, p, p, p, p, p, 1, 2, T(1e-5));
  k::layer_norm_backward_params(on, p, p, p, p, p, 1, 2);
  k::layer_norm_backward_input(on, p, p, p, p, p, 1, 2);
  k::global_maxpool_forward(on, p, p, 1, 1);
  k::global_maxpool_backward(on, p, p, p, 1, 1);
  k::cdist_forward(on, p, p, p, 1, 1, 1, 1);
  k::cdist_backward_a(on, p, p, p, p, p, 1, 1, 1, 1);
  k::cdist_backward_b(on, p, p, p, p, p, 1, 1, 1, 1);
  k::amax_forward(on, p, p, 1, 1);
  k::amax_backward(on, p, p, p, 1, 1);
  k::global_avgpool_forward(on, p, p, 1, 1);
  k::global_avgpool_backward(on, p, p, 1, 1);
  const k::Conv conv = k::conv2d_shape(2, 3, 3, 2, 2, 2, 1, 1, 0, 0, 1, 1, 2);
  k::conv2d_forward(on, p, p, p, p, 1, conv);
  k::conv2d_backward_input(on, p, p, p, 1, conv);
  k::conv2d_backward_params(on, p, p, p, p, 1, conv);
  const k::Conv one_group = k::conv2d_shape(2, 3, 3, 2, 2, 2, 1, 1, 0, 0, 1, 1, 1);
  k::conv2d_gemm_forward(on, p, p, p, p, 1, one_group, k::NoAct{}, p);
  k::conv2d_gemm_backward(on, p, p, p, p, p, p, 1, one_group, p);
  k::conv_transpose2d_forward(on, p, p, p, p, 1, conv);
  k::conv_transpose2d_backward_input(on, p, p, p, 1, conv);
  k::conv_transpose2d_backward_params(on, p, p, p, p, 1, conv);
  const k::Pool pool = k::pool2d_shape(2, 2, 2, 2, 1, 1, 0, 0);
  k::maxpool2d_forward(on, p, p, 1, pool);
  k::maxpool2d_backward(on, p, p, p, 1, pool);
  k::avgpool2d_forward(on, p, p, 1, pool, 1);
  k::avgpool2d_backward(on, p, p, 1, pool, 1);
  const k::Adaptive adaptive{2, 3, 3, 2};
  k::adaptive_maxpool_forward(on, p, p, 1, adaptive);
  k::adaptive_avgpool_forward(on, p, p, 1, adaptive);
  k::adaptive_pool_backward(on, p, p, p, 1, adaptive, 1);
  k::batch_norm_stats(on, p, p, p, p, p, 1, 1, 1, T(1e-5), T(0.1), 1);
  k::batch_norm_apply(on, p, p, p, p, p, 1, 1, 1);
  k::batch_norm_backward_reduce(on, p, p, p, p, p, 1, 1, 1);
  k::batch_norm_backward_input(on, p, p, p, p, p, 1, 1, 1, 1);
  k::loss_and_gradient(on, p, p, p, p, p, 1, 1, T(1), k::BceWithLogits{});
  k::loss_and_gradient(on, p, p, p, p, p, 1, 1, T(1), k::Mse{});
  k::loss_and_gradient(on, p, p, p, p, p, 1, 1, T(1), k::Huber{});
  k::cross_entropy_forward(on, p, p, p, p, 1, 2);
  k::cross_entropy_backward(on, p, p, p, p, 1, 2, T(1));
  k::nll_forward(on, p, p, p, p, 1, 2);
  k::nll_backward(on, p, p, p, 1, 2, T(1));
  k::optim_step(on, p, p, p, p, 1, rootclad::OptimConfig{}, 1);
  k::optim_step_in_memory(on, p, p, p, p, 1, (const rootclad::OptimConfig*)nullptr, (long*)nullptr,
                          (rootclad::OptimStep<T>*)nullptr);
}

template void instantiate<float>();
template void instantiate<double>();
