// rootclad/model_runtime.h — what every compiled model runs the same way: a batch split into
// chunks over the thread pool, the parameter gradients summed, the weighted loss, the fused
// training step, and the C API that Python (ctypes), ROOT (Cling) and C++ programs call.
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
// ROOTCLAD_EXPORT_MODEL(PREFIX, MODEL) then defines the C API, PREFIX_<name> for each entry
// below; the build exports nothing else (-fvisibility=hidden), so that two model libraries in
// one process never bind to each other's inline functions and statics (their thread pools and
// per-thread flags then mixed, and a training step deadlocked).
#ifndef ROOTCLAD_MODEL_RUNTIME_H
#define ROOTCLAD_MODEL_RUNTIME_H

#include <atomic>
#include <cstdint>
#include <vector>

#include "kernels.h"
#include "linear_update.h"
#include "optim.h"
#include "parallel.h"

namespace rootclad {

// need_dx flags: 1 = the inputs' gradient; 1 | NO_PARAM_GRADIENT = the inputs' alone: the
// pullback engine then skips the parameters' (d_params is not filled)
constexpr int NO_PARAM_GRADIENT = 2;
// Chunks of fewer samples than this are not worth a thread: BLAS threads instead.
constexpr int MIN_CHUNK = 4;

template <class M> struct ModelRuntime {
  using T = typename M::T;
  // a gradient block: the parameters' and room for the buffers' (never written)
  static constexpr long N_SLOTS = M::N_PARAMS + M::N_BUFFERS;

  enum Mode { FORWARD, LOSS_AND_GRAD, VJP };
  struct Job {
    Mode mode;
    T* params;
    T* act;
    const T* y;
    T* d_params;
    T* d_act;
    const T* d_out;
    int Bf, training, need_dx;
    std::uint64_t seed;
    const T* w = nullptr; // per-sample loss weights (LOSS_AND_GRAD), or none
    T* scratch = nullptr; // the other threads' gradient blocks
    T* dz = nullptr;      // with w: the weighted loss's d_output, Bf samples
    // BatchNorm in a batch split into chunks: the chunks' shared sums (parallel.h)
    double* sync_values = nullptr;
    std::atomic<int> arrived{0}, generation{0};
    T loss[MAX_THREADS];
  };

  // The chunk's share of the mean loss and its gradient, after forward_chunk().
  static T loss_and_grad_chunk(T* params, T* act, const T* y, T* d_params, T* d_act, int Bf, int b0,
                               int B, int training, std::uint64_t seed, int need_dx) {
    const T scale = T(B) / T(Bf);
    M::zero_adjoints(d_act, Bf, b0, B, need_dx);
    M::forward_chunk(params, act, Bf, b0, B, training, seed);
    const T L = M::loss_chunk(act, y, Bf, b0, B);
    M::loss_pullback(act, y, d_act, Bf, b0, B, scale);
    M::backward_chunk(params, act, d_params, d_act, Bf, b0, B, training, seed, need_dx);
    return L;
  }

  // The vector-Jacobian product for an upstream gradient d_out (Bf samples), after
  // forward_chunk().
  static void vjp_chunk(T* params, T* act, T* d_params, T* d_act, const T* d_out, int Bf, int b0,
                        int B, int training, std::uint64_t seed, int need_dx) {
    M::zero_adjoints(d_act, Bf, b0, B, need_dx);
    copy(d_act + (long)Bf * M::OUTPUT_OFFSET + (long)b0 * M::OUTPUT_SIZE,
         d_out + (long)b0 * M::OUTPUT_SIZE, (long)B * M::OUTPUT_SIZE);
    M::backward_chunk(params, act, d_params, d_act, Bf, b0, B, training, seed, need_dx);
  }

  // The chunk's share of the weighted mean loss (kernels.h: weighted_loss) after
  // forward_chunk(); writes its gradient w.r.t. the output to dz (Bf samples).
  static T weighted_loss_chunk(T* act, const T* y, const T* w, T* dz, int Bf, int b0, int B) {
    const T* out = act + (long)Bf * M::OUTPUT_OFFSET + (long)b0 * M::OUTPUT_SIZE;
    return column_loss(M::LOSS_KIND, out, y + (long)b0 * M::TARGET_SIZE, w ? w + b0 : nullptr,
                       dz + (long)b0 * M::OUTPUT_SIZE, Bf, B, (int)M::LOSS_COLUMN,
                       (int)M::LOSS_SIZE, (int)M::OUTPUT_SIZE);
  }

  static void run_chunk(void* ctx, int t, int n) {
    Job& j = *static_cast<Job*>(ctx);
    ChunkSync sync{t, n, j.sync_values, M::SYNC_SLOT, &j.arrived, &j.generation};
    ChunkSyncScope scope(M::BATCH_STATISTICS && n > 1 ? &sync : nullptr);
    int b0, b1;
    chunk_range(j.Bf, n, t, b0, b1);
    const int B = b1 - b0;
    if (j.mode == FORWARD) {
      M::forward_chunk(j.params, j.act, j.Bf, b0, B, j.training, j.seed);
      return;
    }
    // thread 0 writes the caller's gradient, the others their own block of scratch
    T* dp = t == 0 ? j.d_params : j.scratch + (long)(t - 1) * N_SLOTS;
    // the pullback engine leaves d_params alone for an input gradient alone; Clad's sweep
    // adds into it regardless
    if (!(M::PARAM_GRADIENT_SKIPPED && (j.need_dx & NO_PARAM_GRADIENT)))
      zero(dp, N_SLOTS);
    if (j.mode == LOSS_AND_GRAD && (j.w || M::LOSS_SIZE != M::OUTPUT_SIZE)) {
      // weighted, or a loss on one of several outputs: the loss's gradient is formed here,
      // the model's backward is the VJP
      M::forward_chunk(j.params, j.act, j.Bf, b0, B, j.training, j.seed);
      j.loss[t] = weighted_loss_chunk(j.act, j.y, j.w, j.dz, j.Bf, b0, B);
      vjp_chunk(j.params, j.act, dp, j.d_act, j.dz, j.Bf, b0, B, j.training, j.seed, j.need_dx);
    } else if (j.mode == LOSS_AND_GRAD) {
      j.loss[t] = loss_and_grad_chunk(j.params, j.act, j.y, dp, j.d_act, j.Bf, b0, B, j.training,
                                      j.seed, j.need_dx);
    } else {
      vjp_chunk(j.params, j.act, dp, j.d_act, j.d_out, j.Bf, b0, B, j.training, j.seed, j.need_dx);
    }
  }

  // Every extra chunk adds a parameter-gradient block to fill and sum, so a batch is split
  // when its activations outweigh the parameters, or its arithmetic does by far (the MLP
  // 2048-256-64-1: not at batch 64, at 256; the GW CNN: from batch 8).
  static int threads_for(int Bf) {
    if ((double)Bf * M::ACT_FLAT_PER_SAMPLE < 2.0 * M::N_PARAMS &&
        (double)Bf * M::FLOPS_PER_SAMPLE < 256.0 * M::N_PARAMS)
      return 1;
    int n = ThreadPool::instance().size();
    const int by_batch = Bf / MIN_CHUNK;
    n = n < by_batch ? n : by_batch;
    return n < 1 ? 1 : n;
  }

  // d_params += the other threads' gradients, split over the pool by parameter range.
  struct Reduce {
    T* d_params;
    const T* scratch;
    int parts;
  };
  static void reduce_range(void* ctx, int t, int n) {
    const Reduce& r = *static_cast<const Reduce*>(ctx);
    int p0, p1;
    chunk_range((int)M::N_PARAMS, n, t, p0, p1);
    for (int k = 0; k < r.parts; ++k) {
      const T* src = r.scratch + (long)k * N_SLOTS;
      for (int i = p0; i < p1; ++i)
        r.d_params[i] += src[i];
    }
  }

  static T run(Job& j) {
    auto& pool = ThreadPool::instance();
    const int n = threads_for(j.Bf);
    // per calling thread, grown once: nothing is allocated in steady state
    static thread_local std::vector<T> scratch, dz;
    if ((j.w || M::LOSS_SIZE != M::OUTPUT_SIZE) && dz.size() < (size_t)j.Bf * M::OUTPUT_SIZE)
      dz.resize((size_t)j.Bf * M::OUTPUT_SIZE);
    j.dz = dz.data();
    static thread_local std::vector<double> sync_values;
    if (M::BATCH_STATISTICS && n > 1 && sync_values.size() < (size_t)n * M::SYNC_SLOT)
      sync_values.resize((size_t)n * M::SYNC_SLOT);
    j.sync_values = sync_values.data();
    if (j.mode != FORWARD && n > 1) {
      if (scratch.size() < (size_t)(n - 1) * N_SLOTS)
        scratch.resize((size_t)(n - 1) * N_SLOTS);
      j.scratch = scratch.data();
    }
    pool.run(run_chunk, &j, n);
    if (j.mode == FORWARD)
      return T(0);
    if (n > 1 && !((j.need_dx & NO_PARAM_GRADIENT) && M::PARAM_GRADIENT_SKIPPED)) {
      Reduce r{j.d_params, j.scratch, n - 1};
      pool.run(reduce_range, &r, M::N_PARAMS >= 65536 ? pool.size() : 1);
    }
    T L = 0;
    for (int t = 0; t < n; ++t)
      L += j.loss[t];
    return L;
  }

  static Job job(Mode mode, T* params, T* act, const T* y, T* d_params, T* d_act, const T* d_out,
                 int B, int training, int need_dx, std::uint64_t seed) {
    return Job{mode, params, act, y, d_params, d_act, d_out, B, training, need_dx, seed};
  }

  // -- the C API's entry points --------------------------------------------------------------
  static void forward(T* params, T* act, int B, int training, std::uint64_t seed) {
    Job j = job(FORWARD, params, act, nullptr, nullptr, nullptr, nullptr, B, training, 0, seed);
    run(j);
  }

  static T loss_and_grad(T* params, T* act, const T* y, T* d_params, T* d_act, int B, int training,
                         std::uint64_t seed, int need_dx, const T* w) {
    Job j =
        job(LOSS_AND_GRAD, params, act, y, d_params, d_act, nullptr, B, training, need_dx, seed);
    j.w = w;
    return run(j);
  }

  static void vjp(T* params, T* act, T* d_params, T* d_act, const T* d_out, int B, int training,
                  std::uint64_t seed, int need_dx) {
    Job j = job(VJP, params, act, nullptr, d_params, d_act, d_out, B, training, need_dx, seed);
    run(j);
  }

  // train_step at batches of at most FUSED_UPDATE_MAX_BATCH samples, as one chunk: forward,
  // loss, and a sweep that updates some parameters as soon as their gradient is known (the
  // model's backward_update_chunk); the others' gradients are formed as in loss_and_grad and
  // updated at the end, one contiguous run of the block at a time.
  static T train_chunk(T* params, T* act, const T* y, T* d_params, T* d_act, T* state,
                       const double* cfg, long step, int B, std::uint64_t seed) {
    M::zero_adjoints(d_act, B, 0, B, 0);
    for (int i = 0; M::UPDATE_RUNS[i] >= 0; i += 2)
      zero(d_params + M::UPDATE_RUNS[i], M::UPDATE_RUNS[i + 1]);
    M::forward_chunk(params, act, B, 0, B, 1, seed);
    const T L = M::loss_chunk(act, y, B, 0, B);
    M::loss_pullback(act, y, d_act, B, 0, B, T(1));
    M::backward_update_chunk(params, act, d_params, d_act, state, cfg, step, B, seed);
    for (int i = 0; M::UPDATE_RUNS[i] >= 0; i += 2) {
      const long off = M::UPDATE_RUNS[i], n = M::UPDATE_RUNS[i + 1];
      optim_step_mv(params + off, d_params + off, state + off, state + M::N_PARAMS + off, n, cfg,
                    step);
    }
    return L;
  }

  // forward + backward + optimizer update in one call; returns the loss. tensor_steps: null
  // (every parameter tensor at `step`), or each parameter tensor's own step count, 0 for a
  // frozen one (not updated). w: per-sample loss weights.
  static T train_step(T* params, T* act, const T* y, T* d_params, T* d_act, T* opt_state,
                      const double* opt_cfg, long step, int B, std::uint64_t seed,
                      const long* tensor_steps, const T* w) {
    if (M::FUSED_TRAIN_STEP && !tensor_steps && !w && B <= FUSED_UPDATE_MAX_BATCH &&
        threads_for(B) == 1)
      return train_chunk(params, act, y, d_params, d_act, opt_state, opt_cfg, step, B, seed);
    const T L = loss_and_grad(params, act, y, d_params, d_act, B, 1, seed, 0, w);
    optim_update(params, d_params, opt_state, opt_cfg, step, tensor_steps);
    return L;
  }

  // The optimizer's update of the parameters from the gradient block d_params as it stands
  // (train_step's last part; a data-parallel step calls it after all-reducing the block).
  // tensor_steps as in train_step: a frozen tensor (0) is not updated.
  static void optim_update(T* params, const T* d_params, T* opt_state, const double* opt_cfg,
                           long step, const long* tensor_steps) {
    if (!tensor_steps) {
      optim_step(params, d_params, opt_state, M::N_PARAMS, opt_cfg, step);
      return;
    }
    for (int i = 0; i < M::N_PARAM_TENSORS; ++i) {
      if (tensor_steps[i] <= 0)
        continue;
      const long off = M::PARAM_OFFSETS[i], n = M::PARAM_OFFSETS[i + 1] - off;
      optim_step_mv(params + off, d_params + off, opt_state + off, opt_state + M::N_PARAMS + off, n,
                    opt_cfg, tensor_steps[i]);
    }
  }

  // -- the layout, for C++ hosts (LibTorch, Cling) that run without the Python side ----------
  // Offsets and sizes count elements of T per sample (multiply by B); shapes exclude the batch
  // dimension. Out-of-range parameter indices give nullptr / -1.
  static bool bad_param(int i) { return i < 0 || i >= M::N_PARAM_TENSORS; }
  static const char* param_name(int i) { return bad_param(i) ? nullptr : M::PARAM_NAMES[i]; }
  static long param_offset(int i) { return bad_param(i) ? -1 : M::PARAM_OFFSETS[i]; }
  static long param_numel(int i) {
    return bad_param(i) ? -1 : M::PARAM_OFFSETS[i + 1] - M::PARAM_OFFSETS[i];
  }
  static const long* param_shape(int i, int* ndim) {
    if (bad_param(i)) {
      *ndim = -1;
      return nullptr;
    }
    *ndim = M::PARAM_DIM_STARTS[i + 1] - M::PARAM_DIM_STARTS[i];
    return M::PARAM_DIMS + M::PARAM_DIM_STARTS[i];
  }
  static const long* input_shape(int* ndim) {
    *ndim = M::INPUT_NDIM;
    return M::INPUT_SHAPE;
  }
  static const long* output_shape(int* ndim) {
    *ndim = M::OUTPUT_NDIM;
    return M::OUTPUT_SHAPE;
  }
};

} // namespace rootclad

// The C API of model MODEL (a struct as described at the top), every name prefixed PREFIX_.
#define ROOTCLAD_EXPORT_MODEL(PREFIX, MODEL)                                                       \
  extern "C" {                                                                                     \
  ROOTCLAD_API(PREFIX, MODEL)                                                                      \
  }

#define ROOTCLAD_VISIBLE __attribute__((visibility("default")))
#define ROOTCLAD_API(P, M)                                                                         \
  using P##_T = M::T;                                                                              \
  using P##_R = ::rootclad::ModelRuntime<M>;                                                       \
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
    P##_R::forward(params, act, B, training, seed);                                                \
  }                                                                                                \
  ROOTCLAD_VISIBLE P##_T P##_loss_value(P##_T* act, const P##_T* y, int B) {                       \
    return M::loss_chunk(act, y, B, 0, B);                                                         \
  }                                                                                                \
  /* w: per-sample loss weights (B values), or null */                                             \
  ROOTCLAD_VISIBLE P##_T P##_loss_and_grad(P##_T* params, P##_T* act, const P##_T* y,              \
                                           P##_T* d_params, P##_T* d_act, int B, int training,     \
                                           std::uint64_t seed, int need_dx, const P##_T* w) {      \
    return P##_R::loss_and_grad(params, act, y, d_params, d_act, B, training, seed, need_dx, w);   \
  }                                                                                                \
  /* need_dx: 0, 1 (the inputs' gradient too), or 3 (the inputs' gradient alone: d_params is       \
     then not filled) */                                                                           \
  ROOTCLAD_VISIBLE void P##_vjp(P##_T* params, P##_T* act, P##_T* d_params, P##_T* d_act,          \
                                const P##_T* d_out, int B, int training, std::uint64_t seed,       \
                                int need_dx) {                                                     \
    P##_R::vjp(params, act, d_params, d_act, d_out, B, training, seed, need_dx);                   \
  }                                                                                                \
  ROOTCLAD_VISIBLE P##_T P##_train_step(                                                           \
      P##_T* params, P##_T* act, const P##_T* y, P##_T* d_params, P##_T* d_act, P##_T* opt_state,  \
      const double* opt_cfg, long step, int B, std::uint64_t seed, const long* tensor_steps,       \
      const P##_T* w) {                                                                            \
    return P##_R::train_step(params, act, y, d_params, d_act, opt_state, opt_cfg, step, B, seed,   \
                             tensor_steps, w);                                                     \
  }                                                                                                \
  /* the update alone, from the gradient block as it stands (an all-reduced one) */                \
  ROOTCLAD_VISIBLE void P##_optim_update(P##_T* params, const P##_T* d_params, P##_T* opt_state,   \
                                         const double* opt_cfg, long step,                         \
                                         const long* tensor_steps) {                               \
    P##_R::optim_update(params, d_params, opt_state, opt_cfg, step, tensor_steps);                 \
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
    return P##_R::input_shape(ndim);                                                               \
  }                                                                                                \
  ROOTCLAD_VISIBLE long P##_output_offset() {                                                      \
    return M::OUTPUT_OFFSET;                                                                       \
  }                                                                                                \
  ROOTCLAD_VISIBLE long P##_output_size() {                                                        \
    return M::OUTPUT_SIZE;                                                                         \
  }                                                                                                \
  ROOTCLAD_VISIBLE const long* P##_output_shape(int* ndim) {                                       \
    return P##_R::output_shape(ndim);                                                              \
  }                                                                                                \
  ROOTCLAD_VISIBLE int P##_param_count() {                                                         \
    return M::N_PARAM_TENSORS;                                                                     \
  }                                                                                                \
  ROOTCLAD_VISIBLE const char* P##_param_name(int i) {                                             \
    return P##_R::param_name(i);                                                                   \
  }                                                                                                \
  ROOTCLAD_VISIBLE long P##_param_offset(int i) {                                                  \
    return P##_R::param_offset(i);                                                                 \
  }                                                                                                \
  ROOTCLAD_VISIBLE long P##_param_numel(int i) {                                                   \
    return P##_R::param_numel(i);                                                                  \
  }                                                                                                \
  ROOTCLAD_VISIBLE const long* P##_param_shape(int i, int* ndim) {                                 \
    return P##_R::param_shape(i, ndim);                                                            \
  }

#endif // ROOTCLAD_MODEL_RUNTIME_H
