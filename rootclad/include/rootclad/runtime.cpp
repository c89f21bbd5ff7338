// rootclad/runtime.cpp — the runtime library: every CPU kernel, for float and double, and the
// model runtime (model_runtime_impl.h), compiled once per machine, compiler and flags into the
// cache (rootclad/toolchain/recipes.py: runtime_library). A model's generated C++ declares the
// kernels only (ROOTCLAD_DECLARATIONS_ONLY) and links against this library, so its build
// compiles the model's own code and nothing else.
#define ROOTCLAD_RUNTIME_DEFINITIONS // the thread-locals ops/core.h declares, defined here once

#include "kernels.h"
#include "linear_update.h"
#include "model_runtime_impl.h"
#include "optim.h"

// Taking each kernel's address for float and double instantiates it here; the library's
// version script (RUNTIME_EXPORTS in toolchain/recipes.py) exports every rootclad:: symbol, under a
// version named after the library's content, so a model binds to the runtime it was built with.
#define ROOTCLAD_KEEP(f) (void*)&::rootclad::f<float>, (void*)&::rootclad::f<double>,
#define ROOTCLAD_KEEP_UNARY(F)                                                                     \
  ROOTCLAD_KEEP_FUNCTOR(unary_forward, F) ROOTCLAD_KEEP_FUNCTOR(unary_backward, F)
#define ROOTCLAD_KEEP_PARAMETRIC(F)                                                                \
  ROOTCLAD_KEEP_FUNCTOR(parametric_forward, F) ROOTCLAD_KEEP_FUNCTOR(parametric_backward, F)
#define ROOTCLAD_KEEP_FUNCTOR(f, F)                                                                \
  (void*)&::rootclad::f<float, ::rootclad::F>, (void*)&::rootclad::f<double, ::rootclad::F>,

// clang-format off
#define ROOTCLAD_KERNELS(X)                                                                        \
  X(binary_forward) X(binary_backward)                                                             \
  X(conv1d_forward) X(conv1d_backward)                                                             \
  X(conv2d_forward) X(conv2d_backward) X(conv_transpose2d_forward) X(conv_transpose2d_backward)    \
  X(maxpool2d_forward) X(maxpool2d_backward) X(avgpool2d_forward) X(avgpool2d_backward)            \
  X(linear_forward) X(linear_backward) X(matmul_forward) X(matmul_backward)                        \
  X(embedding_forward) X(embedding_backward)                                                       \
  X(cdist_forward) X(cdist_backward)                                                               \
  X(dropout_forward) X(dropout_backward) X(sample_dropout_forward) X(sample_dropout_backward)      \
  X(normal_forward)                                                                                \
  X(bce_with_logits_forward) X(bce_with_logits_backward) X(mse_forward) X(mse_backward)            \
  X(cross_entropy_forward) X(cross_entropy_backward) X(nll_forward) X(nll_backward)                \
  X(huber_forward) X(huber_backward) X(column_loss) X(weighted_loss)                               \
  X(softmax_forward) X(safe_softmax_forward) X(softmax_backward) X(log_softmax_forward)            \
  X(log_softmax_backward) X(layer_norm_forward) X(layer_norm_backward)                             \
  X(batch_norm_forward) X(batch_norm_backward)                                                     \
  X(maxpool1d_forward) X(maxpool1d_backward) X(avgpool1d_forward) X(avgpool1d_backward)            \
  X(adaptive_avgpool_forward) X(adaptive_avgpool_backward) X(adaptive_maxpool_forward)             \
  X(adaptive_maxpool_backward) X(upsample_forward) X(upsample_backward)                            \
  X(amax_forward) X(amax_backward)                                                                 \
  X(permute_forward) X(permute_backward) X(cat_part_forward) X(cat_part_backward)                  \
  X(slice_forward) X(slice_backward) X(pad_forward) X(pad_backward)                                \
  X(parameter_forward) X(parameter_backward) X(expand_forward) X(expand_backward)                  \
  X(topk_forward) X(gather_forward) X(gather_backward)                                             \
  X(conv3d_forward) X(conv3d_backward) X(maxpool3d_forward) X(maxpool3d_backward)                  \
  X(avgpool3d_forward) X(avgpool3d_backward)                                                       \
  X(linear_backward_update) X(optim_update) X(optim_step_mv) X(optim_step)                         \
  X(model_forward) X(model_loss_and_grad) X(model_vjp) X(model_vjp_chunk)                          \
  X(model_train_step) X(model_optim_update)
// clang-format on

extern "C" ROOTCLAD_SHARED void* const rootclad_runtime_kernels[] = {
    ROOTCLAD_KERNELS(ROOTCLAD_KEEP) ROOTCLAD_UNARY_FUNCTORS(ROOTCLAD_KEEP_UNARY)
        ROOTCLAD_PARAMETRIC_FUNCTORS(ROOTCLAD_KEEP_PARAMETRIC) nullptr};
