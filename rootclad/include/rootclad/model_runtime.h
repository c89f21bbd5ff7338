// rootclad/model_runtime.h — what a generated model hands the runtime library, and the C API
// that Python (ctypes), ROOT (Cling) and C++ programs call.
//
// A generated model (rootclad/codegen/cpu.py) is a namespace holding one struct, `Model`, with
// its layout as constants and its passes over one chunk of a batch (samples [b0, b0 + B) of a
// batch of Bf):
//
//   using T;                                    float or double
//   N_PARAMS, N_BUFFERS                         the parameter block, then the buffers
//   BATCH_STATISTICS, SYNC_SLOT                 whether an op mixes the batch (BatchNorm), and
//                                               the values a chunk shares per such op
//   ACT_PER_SAMPLE, D_ACT_PER_SAMPLE            act and d_act, per sample
//   ACT_FLAT_PER_SAMPLE, FLOPS_PER_SAMPLE       a region per value; multiply-adds x 2
//   PARAM_GRADIENT_SKIPPED                      the sweep leaves d_params alone for an input
//                                               gradient (NO_PARAM_GRADIENT)
//   LOSS_KIND, OUTPUT_OFFSET, OUTPUT_SIZE,      the loss (weighted_loss's number), the output's
//   TARGET_SIZE, LOSS_COLUMN, LOSS_SIZE         region, one sample's targets, and the columns
//                                               of the output the loss reads (a model with
//                                               several outputs concatenates them)
//   INPUT_OFFSET, INPUT_SIZE, N_INPUTS          the first input's region, the inputs
//   ENGINE, DTYPE, LOSS                         what the C API reports
//   PARAM_NAMES, PARAM_OFFSETS, PARAM_DIMS,     the parameter tensors (each table ends in a
//   PARAM_DIM_STARTS, N_PARAM_TENSORS,          sentinel)
//   INPUT_SHAPE, INPUT_NDIM, OUTPUT_SHAPE, OUTPUT_NDIM
//   forward_chunk(params, act, Bf, b0, B, training, seed)
//   loss_chunk(act, y, Bf, b0, B)               the chunk's share of the batch's mean loss
//   zero_adjoints(d_act, Bf, b0, B, need_dx)    the adjoints the sweep does not zero itself
//   loss_pullback(act, y, d_act, Bf, b0, B, scale)   the loss's adjoint into the output's
//   backward_chunk(params, act, d_params, d_act, Bf, b0, B, training, seed, need_dx)
//   FUSED_TRAIN_STEP, UPDATE_RUNS,              train_step at small batches: a sweep that
//   backward_update_chunk(params, act, d_params, updates some parameters as it goes, and the
//       d_act, state, cfg, step, B, seed)       runs of the others (offset, count; -1 ends)
//
// ROOTCLAD_EXPORT_MODEL(PREFIX, MODEL) gathers them into a ModelDesc and defines the C API,
// PREFIX_<name> for each entry below, each a call into the runtime library
// (model_runtime_impl.h, built once per machine and compiler: runtime.cpp), which splits the
// batch over its thread pool, sums the gradients, weighs the loss and steps the optimizer. The
// model's library exports its C API alone (-fvisibility=hidden and a version script).
#ifndef ROOTCLAD_MODEL_RUNTIME_H
#define ROOTCLAD_MODEL_RUNTIME_H

#include <cstdint>

namespace rootclad {

// need_dx flags: 1 = the inputs' gradient; 1 | NO_PARAM_GRADIENT = the inputs' alone: the
// pullback engine then skips the parameters' (d_params is not filled)
constexpr int NO_PARAM_GRADIENT = 2;

// A model as the runtime runs it: its layout and its passes (the Model struct's, above).
template <class T> struct ModelDesc {
  long N_PARAMS, N_BUFFERS;
  bool BATCH_STATISTICS;
  long SYNC_SLOT;
  bool PARAM_GRADIENT_SKIPPED;
  long ACT_PER_SAMPLE, D_ACT_PER_SAMPLE, ACT_FLAT_PER_SAMPLE;
  double FLOPS_PER_SAMPLE;
  int LOSS_KIND;
  long OUTPUT_OFFSET, OUTPUT_SIZE, TARGET_SIZE, LOSS_COLUMN, LOSS_SIZE;
  int N_INPUTS;
  long INPUT_OFFSET, INPUT_SIZE;
  const char *ENGINE, *DTYPE, *LOSS;
  const char* const* PARAM_NAMES;
  const long* PARAM_OFFSETS;
  const long* PARAM_DIMS;
  const int* PARAM_DIM_STARTS;
  int N_PARAM_TENSORS;
  const long* INPUT_SHAPE;
  int INPUT_NDIM;
  const long* OUTPUT_SHAPE;
  int OUTPUT_NDIM;
  bool FUSED_TRAIN_STEP;
  const long* UPDATE_RUNS;
  void (*forward_chunk)(T* params, T* act, int Bf, int b0, int B, int training, std::uint64_t seed);
  T (*loss_chunk)(T* act, const T* y, int Bf, int b0, int B);
  void (*zero_adjoints)(T* d_act, int Bf, int b0, int B, int need_dx);
  void (*loss_pullback)(T* act, const T* y, T* d_act, int Bf, int b0, int B, T scale);
  void (*backward_chunk)(T* params, T* act, T* d_params, T* d_act, int Bf, int b0, int B,
                         int training, std::uint64_t seed, int need_dx);
  void (*backward_update_chunk)(T* params, T* act, T* d_params, T* d_act, T* state,
                                const double* cfg, long step, int B, std::uint64_t seed);
};

// The runtime library's entry points (defined in model_runtime_impl.h, for float and double).
// forward/loss_and_grad/vjp/train_step split the batch over the thread pool. w: per-sample
// loss weights (B values), or null. need_dx: 0, 1 (the inputs' gradient too), or 3 (the
// inputs' gradient alone: d_params is then not filled). tensor_steps: null (every parameter
// tensor at `step`), or each parameter tensor's own step count, 0 for a frozen one.
template <class T>
void model_forward(const ModelDesc<T>& M, T* params, T* act, int B, int training,
                   std::uint64_t seed);
template <class T>
T model_loss_and_grad(const ModelDesc<T>& M, T* params, T* act, const T* y, T* d_params, T* d_act,
                      int B, int training, std::uint64_t seed, int need_dx, const T* w);
template <class T>
void model_vjp(const ModelDesc<T>& M, T* params, T* act, T* d_params, T* d_act, const T* d_out,
               int B, int training, std::uint64_t seed, int need_dx);
// one chunk of it, on this thread (a standalone header's pullback)
template <class T>
void model_vjp_chunk(const ModelDesc<T>& M, T* params, T* act, T* d_params, T* d_act,
                     const T* d_out, int Bf, int b0, int B, int training, std::uint64_t seed,
                     int need_dx);
template <class T>
T model_train_step(const ModelDesc<T>& M, T* params, T* act, const T* y, T* d_params, T* d_act,
                   T* opt_state, const double* opt_cfg, long step, int B, std::uint64_t seed,
                   const long* tensor_steps, const T* w);
// the update alone, from the gradient block as it stands (an all-reduced one)
template <class T>
void model_optim_update(const ModelDesc<T>& M, T* params, const T* d_params, T* opt_state,
                        const double* opt_cfg, long step, const long* tensor_steps);

// The ModelDesc of a Model struct (above).
template <class M> constexpr ModelDesc<typename M::T> model_desc() {
  return {M::N_PARAMS,
          M::N_BUFFERS,
          M::BATCH_STATISTICS,
          M::SYNC_SLOT,
          M::PARAM_GRADIENT_SKIPPED,
          M::ACT_PER_SAMPLE,
          M::D_ACT_PER_SAMPLE,
          M::ACT_FLAT_PER_SAMPLE,
          M::FLOPS_PER_SAMPLE,
          M::LOSS_KIND,
          M::OUTPUT_OFFSET,
          M::OUTPUT_SIZE,
          M::TARGET_SIZE,
          M::LOSS_COLUMN,
          M::LOSS_SIZE,
          M::N_INPUTS,
          M::INPUT_OFFSET,
          M::INPUT_SIZE,
          M::ENGINE,
          M::DTYPE,
          M::LOSS,
          M::PARAM_NAMES,
          M::PARAM_OFFSETS,
          M::PARAM_DIMS,
          M::PARAM_DIM_STARTS,
          M::N_PARAM_TENSORS,
          M::INPUT_SHAPE,
          M::INPUT_NDIM,
          M::OUTPUT_SHAPE,
          M::OUTPUT_NDIM,
          M::FUSED_TRAIN_STEP,
          M::UPDATE_RUNS,
          &M::forward_chunk,
          &M::loss_chunk,
          &M::zero_adjoints,
          &M::loss_pullback,
          &M::backward_chunk,
          &M::backward_update_chunk};
}

} // namespace rootclad

// The C API of model MODEL (a struct as described at the top), every name prefixed PREFIX_.
#define ROOTCLAD_EXPORT_MODEL(PREFIX, MODEL)                                                       \
  extern "C" {                                                                                     \
  ROOTCLAD_API(PREFIX, MODEL)                                                                      \
  }

#define ROOTCLAD_VISIBLE __attribute__((visibility("default")))
#define ROOTCLAD_API(P, M)                                                                         \
  using P##_T = M::T;                                                                              \
  static constexpr ::rootclad::ModelDesc<P##_T> P##_desc = ::rootclad::model_desc<M>();            \
  ROOTCLAD_VISIBLE long P##_n_params() {                                                           \
    return M::N_PARAMS;                                                                            \
  }                                                                                                \
  ROOTCLAD_VISIBLE long P##_n_buffers() {                                                          \
    return M::N_BUFFERS;                                                                           \
  }                                                                                                \
  ROOTCLAD_VISIBLE long P##_act_size(int B) {                                                      \
    return (long)B * M::ACT_PER_SAMPLE;                                                            \
  }                                                                                                \
  ROOTCLAD_VISIBLE long P##_d_act_size(int B) {                                                    \
    return (long)B * M::D_ACT_PER_SAMPLE;                                                          \
  }                                                                                                \
  ROOTCLAD_VISIBLE const char* P##_engine() {                                                      \
    return M::ENGINE;                                                                              \
  }                                                                                                \
  ROOTCLAD_VISIBLE void P##_forward(P##_T* params, P##_T* act, int B, int training,                \
                                    std::uint64_t seed) {                                          \
    ::rootclad::model_forward(P##_desc, params, act, B, training, seed);                           \
  }                                                                                                \
  ROOTCLAD_VISIBLE P##_T P##_loss_value(P##_T* act, const P##_T* y, int B) {                       \
    return M::loss_chunk(act, y, B, 0, B);                                                         \
  }                                                                                                \
  /* w: per-sample loss weights (B values), or null */                                             \
  ROOTCLAD_VISIBLE P##_T P##_loss_and_grad(P##_T* params, P##_T* act, const P##_T* y,              \
                                           P##_T* d_params, P##_T* d_act, int B, int training,     \
                                           std::uint64_t seed, int need_dx, const P##_T* w) {      \
    return ::rootclad::model_loss_and_grad(P##_desc, params, act, y, d_params, d_act, B, training, \
                                           seed, need_dx, w);                                      \
  }                                                                                                \
  /* need_dx: 0, 1 (the inputs' gradient too), or 3 (the inputs' gradient alone: d_params is       \
     then not filled) */                                                                           \
  ROOTCLAD_VISIBLE void P##_vjp(P##_T* params, P##_T* act, P##_T* d_params, P##_T* d_act,          \
                                const P##_T* d_out, int B, int training, std::uint64_t seed,       \
                                int need_dx) {                                                     \
    ::rootclad::model_vjp(P##_desc, params, act, d_params, d_act, d_out, B, training, seed,        \
                          need_dx);                                                                \
  }                                                                                                \
  ROOTCLAD_VISIBLE P##_T P##_train_step(                                                           \
      P##_T* params, P##_T* act, const P##_T* y, P##_T* d_params, P##_T* d_act, P##_T* opt_state,  \
      const double* opt_cfg, long step, int B, std::uint64_t seed, const long* tensor_steps,       \
      const P##_T* w) {                                                                            \
    return ::rootclad::model_train_step(P##_desc, params, act, y, d_params, d_act, opt_state,      \
                                        opt_cfg, step, B, seed, tensor_steps, w);                  \
  }                                                                                                \
  /* the update alone, from the gradient block as it stands (an all-reduced one) */                \
  ROOTCLAD_VISIBLE void P##_optim_update(P##_T* params, const P##_T* d_params, P##_T* opt_state,   \
                                         const double* opt_cfg, long step,                         \
                                         const long* tensor_steps) {                               \
    ::rootclad::model_optim_update(P##_desc, params, d_params, opt_state, opt_cfg, step,           \
                                   tensor_steps);                                                  \
  }                                                                                                \
  ROOTCLAD_VISIBLE const char* P##_dtype() {                                                       \
    return M::DTYPE;                                                                               \
  }                                                                                                \
  ROOTCLAD_VISIBLE const char* P##_loss() {                                                        \
    return M::LOSS;                                                                                \
  }                                                                                                \
  ROOTCLAD_VISIBLE int P##_n_inputs() {                                                            \
    return M::N_INPUTS;                                                                            \
  }                                                                                                \
  /* the first input's region and shape (C++ hosts take single-input models) */                    \
  ROOTCLAD_VISIBLE long P##_input_offset() {                                                       \
    return M::INPUT_OFFSET;                                                                        \
  }                                                                                                \
  ROOTCLAD_VISIBLE long P##_input_size() {                                                         \
    return M::INPUT_SIZE;                                                                          \
  }                                                                                                \
  ROOTCLAD_VISIBLE const long* P##_input_shape(int* ndim) {                                        \
    *ndim = M::INPUT_NDIM;                                                                         \
    return M::INPUT_SHAPE;                                                                         \
  }                                                                                                \
  ROOTCLAD_VISIBLE long P##_output_offset() {                                                      \
    return M::OUTPUT_OFFSET;                                                                       \
  }                                                                                                \
  ROOTCLAD_VISIBLE long P##_output_size() {                                                        \
    return M::OUTPUT_SIZE;                                                                         \
  }                                                                                                \
  ROOTCLAD_VISIBLE const long* P##_output_shape(int* ndim) {                                       \
    *ndim = M::OUTPUT_NDIM;                                                                        \
    return M::OUTPUT_SHAPE;                                                                        \
  }                                                                                                \
  ROOTCLAD_VISIBLE int P##_param_count() {                                                         \
    return M::N_PARAM_TENSORS;                                                                     \
  }                                                                                                \
  /* out-of-range parameter indices give nullptr / -1 */                                           \
  ROOTCLAD_VISIBLE const char* P##_param_name(int i) {                                             \
    return i < 0 || i >= M::N_PARAM_TENSORS ? nullptr : M::PARAM_NAMES[i];                         \
  }                                                                                                \
  ROOTCLAD_VISIBLE long P##_param_offset(int i) {                                                  \
    return i < 0 || i >= M::N_PARAM_TENSORS ? -1 : M::PARAM_OFFSETS[i];                            \
  }                                                                                                \
  ROOTCLAD_VISIBLE long P##_param_numel(int i) {                                                   \
    return i < 0 || i >= M::N_PARAM_TENSORS ? -1 : M::PARAM_OFFSETS[i + 1] - M::PARAM_OFFSETS[i];  \
  }                                                                                                \
  ROOTCLAD_VISIBLE const long* P##_param_shape(int i, int* ndim) {                                 \
    if (i < 0 || i >= M::N_PARAM_TENSORS) {                                                        \
      *ndim = -1;                                                                                  \
      return nullptr;                                                                              \
    }                                                                                              \
    *ndim = M::PARAM_DIM_STARTS[i + 1] - M::PARAM_DIM_STARTS[i];                                   \
    return M::PARAM_DIMS + M::PARAM_DIM_STARTS[i];                                                 \
  }

#endif // ROOTCLAD_MODEL_RUNTIME_H
