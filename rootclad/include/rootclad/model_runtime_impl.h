// rootclad/model_runtime_impl.h — the definitions of model_runtime.h's entry points: what every
// compiled model runs the same way (a batch split into chunks over the thread pool, the
// parameter gradients summed, the weighted loss, the fused training step), reading the model's
// layout and passes from its ModelDesc. Compiled once into the runtime library (runtime.cpp),
// for float and double.
#ifndef ROOTCLAD_MODEL_RUNTIME_IMPL_H
#define ROOTCLAD_MODEL_RUNTIME_IMPL_H

#include <atomic>
#include <cstdint>
#include <vector>

#include "kernels.h"
#include "linear_update.h"
#include "model_runtime.h"
#include "optim.h"
#include "parallel.h"

namespace rootclad {

// Chunks of fewer samples than this are not worth a thread: BLAS threads instead.
constexpr int MIN_CHUNK = 4;

template <class T> struct Runtime {
  using Desc = ModelDesc<T>;
  // a gradient block: the parameters' and room for the buffers' (never written)
  static long n_slots(const Desc& M) { return M.N_PARAMS + M.N_BUFFERS; }

  enum Mode { FORWARD, LOSS_AND_GRAD, VJP };
  struct Job {
    const Desc* m;
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
  static T loss_and_grad_chunk(const Desc& M, T* params, T* act, const T* y, T* d_params, T* d_act,
                               int Bf, int b0, int B, int training, std::uint64_t seed,
                               int need_dx) {
    const T scale = T(B) / T(Bf);
    M.zero_adjoints(d_act, Bf, b0, B, need_dx);
    M.forward_chunk(params, act, Bf, b0, B, training, seed);
    const T L = M.loss_chunk(act, y, Bf, b0, B);
    M.loss_pullback(act, y, d_act, Bf, b0, B, scale);
    M.backward_chunk(params, act, d_params, d_act, Bf, b0, B, training, seed, need_dx);
    return L;
  }

  // The vector-Jacobian product for an upstream gradient d_out (Bf samples), after
  // forward_chunk().
  static void vjp_chunk(const Desc& M, T* params, T* act, T* d_params, T* d_act, const T* d_out,
                        int Bf, int b0, int B, int training, std::uint64_t seed, int need_dx) {
    M.zero_adjoints(d_act, Bf, b0, B, need_dx);
    copy(d_act + (long)Bf * M.OUTPUT_OFFSET + (long)b0 * M.OUTPUT_SIZE,
         d_out + (long)b0 * M.OUTPUT_SIZE, (long)B * M.OUTPUT_SIZE);
    M.backward_chunk(params, act, d_params, d_act, Bf, b0, B, training, seed, need_dx);
  }

  // The chunk's share of the weighted mean loss (kernels.h: weighted_loss) after
  // forward_chunk(); writes its gradient w.r.t. the output to dz (Bf samples).
  static T weighted_loss_chunk(const Desc& M, T* act, const T* y, const T* w, T* dz, int Bf, int b0,
                               int B) {
    const T* out = act + (long)Bf * M.OUTPUT_OFFSET + (long)b0 * M.OUTPUT_SIZE;
    return column_loss(M.LOSS_KIND, out, y + (long)b0 * M.TARGET_SIZE, w ? w + b0 : nullptr,
                       dz + (long)b0 * M.OUTPUT_SIZE, Bf, B, (int)M.LOSS_COLUMN, (int)M.LOSS_SIZE,
                       (int)M.OUTPUT_SIZE);
  }

  static void run_chunk(void* ctx, int t, int n) {
    Job& j = *static_cast<Job*>(ctx);
    const Desc& M = *j.m;
    ChunkSync sync{t, n, j.sync_values, M.SYNC_SLOT, &j.arrived, &j.generation};
    ChunkSyncScope scope(M.BATCH_STATISTICS && n > 1 ? &sync : nullptr);
    int b0, b1;
    chunk_range(j.Bf, n, t, b0, b1);
    const int B = b1 - b0;
    if (j.mode == FORWARD) {
      M.forward_chunk(j.params, j.act, j.Bf, b0, B, j.training, j.seed);
      return;
    }
    // thread 0 writes the caller's gradient, the others their own block of scratch
    T* dp = t == 0 ? j.d_params : j.scratch + (long)(t - 1) * n_slots(M);
    // the pullback engine leaves d_params alone for an input gradient alone; Clad's sweep
    // adds into it regardless
    if (!(M.PARAM_GRADIENT_SKIPPED && (j.need_dx & NO_PARAM_GRADIENT)))
      zero(dp, n_slots(M));
    if (j.mode == LOSS_AND_GRAD && (j.w || M.LOSS_SIZE != M.OUTPUT_SIZE)) {
      // weighted, or a loss on one of several outputs: the loss's gradient is formed here,
      // the model's backward is the VJP
      M.forward_chunk(j.params, j.act, j.Bf, b0, B, j.training, j.seed);
      j.loss[t] = weighted_loss_chunk(M, j.act, j.y, j.w, j.dz, j.Bf, b0, B);
      vjp_chunk(M, j.params, j.act, dp, j.d_act, j.dz, j.Bf, b0, B, j.training, j.seed, j.need_dx);
    } else if (j.mode == LOSS_AND_GRAD) {
      j.loss[t] = loss_and_grad_chunk(M, j.params, j.act, j.y, dp, j.d_act, j.Bf, b0, B, j.training,
                                      j.seed, j.need_dx);
    } else {
      vjp_chunk(M, j.params, j.act, dp, j.d_act, j.d_out, j.Bf, b0, B, j.training, j.seed,
                j.need_dx);
    }
  }

  // Every extra chunk adds a parameter-gradient block to fill and sum, so a batch is split
  // when its activations outweigh the parameters, or its arithmetic does by far (the MLP
  // 2048-256-64-1: not at batch 64, at 256; the GW CNN: from batch 8).
  static int threads_for(const Desc& M, int Bf) {
    if ((double)Bf * M.ACT_FLAT_PER_SAMPLE < 2.0 * M.N_PARAMS &&
        (double)Bf * M.FLOPS_PER_SAMPLE < 256.0 * M.N_PARAMS)
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
    long n_params, n_slots;
  };
  static void reduce_range(void* ctx, int t, int n) {
    const Reduce& r = *static_cast<const Reduce*>(ctx);
    long p0 = r.n_params * t / n, p1 = r.n_params * (t + 1) / n;
    for (int k = 0; k < r.parts; ++k) {
      const T* src = r.scratch + (long)k * r.n_slots;
      for (long i = p0; i < p1; ++i)
        r.d_params[i] += src[i];
    }
  }

  static T run(Job& j) {
    const Desc& M = *j.m;
    auto& pool = ThreadPool::instance();
    const int n = threads_for(M, j.Bf);
    // per calling thread, grown once: nothing is allocated in steady state
    static thread_local std::vector<T> scratch, dz;
    if ((j.w || M.LOSS_SIZE != M.OUTPUT_SIZE) && dz.size() < (size_t)j.Bf * M.OUTPUT_SIZE)
      dz.resize((size_t)j.Bf * M.OUTPUT_SIZE);
    j.dz = dz.data();
    static thread_local std::vector<double> sync_values;
    if (M.BATCH_STATISTICS && n > 1 && sync_values.size() < (size_t)n * M.SYNC_SLOT)
      sync_values.resize((size_t)n * M.SYNC_SLOT);
    j.sync_values = sync_values.data();
    if (j.mode != FORWARD && n > 1) {
      if (scratch.size() < (size_t)(n - 1) * n_slots(M))
        scratch.resize((size_t)(n - 1) * n_slots(M));
      j.scratch = scratch.data();
    }
    pool.run(run_chunk, &j, n);
    if (j.mode == FORWARD)
      return T(0);
    if (n > 1 && !((j.need_dx & NO_PARAM_GRADIENT) && M.PARAM_GRADIENT_SKIPPED)) {
      Reduce r{j.d_params, j.scratch, n - 1, M.N_PARAMS, n_slots(M)};
      pool.run(reduce_range, &r, M.N_PARAMS >= 65536 ? pool.size() : 1);
    }
    T L = 0;
    for (int t = 0; t < n; ++t)
      L += j.loss[t];
    return L;
  }

  static Job job(const Desc& M, Mode mode, T* params, T* act, const T* y, T* d_params, T* d_act,
                 const T* d_out, int B, int training, int need_dx, std::uint64_t seed) {
    return Job{&M, mode, params, act, y, d_params, d_act, d_out, B, training, need_dx, seed};
  }

  // train_step at batches of at most FUSED_UPDATE_MAX_BATCH samples, as one chunk: forward,
  // loss, and a sweep that updates some parameters as soon as their gradient is known (the
  // model's backward_update_chunk); the others' gradients are formed as in loss_and_grad and
  // updated at the end, one contiguous run of the block at a time.
  static T train_chunk(const Desc& M, T* params, T* act, const T* y, T* d_params, T* d_act,
                       T* state, const double* cfg, long step, int B, std::uint64_t seed) {
    M.zero_adjoints(d_act, B, 0, B, 0);
    for (int i = 0; M.UPDATE_RUNS[i] >= 0; i += 2)
      zero(d_params + M.UPDATE_RUNS[i], M.UPDATE_RUNS[i + 1]);
    M.forward_chunk(params, act, B, 0, B, 1, seed);
    const T L = M.loss_chunk(act, y, B, 0, B);
    M.loss_pullback(act, y, d_act, B, 0, B, T(1));
    M.backward_update_chunk(params, act, d_params, d_act, state, cfg, step, B, seed);
    for (int i = 0; M.UPDATE_RUNS[i] >= 0; i += 2) {
      const long off = M.UPDATE_RUNS[i], n = M.UPDATE_RUNS[i + 1];
      optim_step_mv(params + off, d_params + off, state + off, state + M.N_PARAMS + off, n, cfg,
                    step);
    }
    return L;
  }
};

// -- the entry points model_runtime.h declares ------------------------------------------------
template <class T>
void model_forward(const ModelDesc<T>& M, T* params, T* act, int B, int training,
                   std::uint64_t seed) {
  using R = Runtime<T>;
  auto j =
      R::job(M, R::FORWARD, params, act, nullptr, nullptr, nullptr, nullptr, B, training, 0, seed);
  R::run(j);
}

template <class T>
T model_loss_and_grad(const ModelDesc<T>& M, T* params, T* act, const T* y, T* d_params, T* d_act,
                      int B, int training, std::uint64_t seed, int need_dx, const T* w) {
  using R = Runtime<T>;
  auto j = R::job(M, R::LOSS_AND_GRAD, params, act, y, d_params, d_act, nullptr, B, training,
                  need_dx, seed);
  j.w = w;
  return R::run(j);
}

template <class T>
void model_vjp(const ModelDesc<T>& M, T* params, T* act, T* d_params, T* d_act, const T* d_out,
               int B, int training, std::uint64_t seed, int need_dx) {
  using R = Runtime<T>;
  auto j =
      R::job(M, R::VJP, params, act, nullptr, d_params, d_act, d_out, B, training, need_dx, seed);
  R::run(j);
}

template <class T>
void model_vjp_chunk(const ModelDesc<T>& M, T* params, T* act, T* d_params, T* d_act,
                     const T* d_out, int Bf, int b0, int B, int training, std::uint64_t seed,
                     int need_dx) {
  Runtime<T>::vjp_chunk(M, params, act, d_params, d_act, d_out, Bf, b0, B, training, seed, need_dx);
}

template <class T>
void model_optim_update(const ModelDesc<T>& M, T* params, const T* d_params, T* opt_state,
                        const double* opt_cfg, long step, const long* tensor_steps) {
  if (!tensor_steps) {
    optim_step(params, d_params, opt_state, M.N_PARAMS, opt_cfg, step);
    return;
  }
  for (int i = 0; i < M.N_PARAM_TENSORS; ++i) {
    if (tensor_steps[i] <= 0)
      continue;
    const long off = M.PARAM_OFFSETS[i], n = M.PARAM_OFFSETS[i + 1] - off;
    optim_step_mv(params + off, d_params + off, opt_state + off, opt_state + M.N_PARAMS + off, n,
                  opt_cfg, tensor_steps[i]);
  }
}

template <class T>
T model_train_step(const ModelDesc<T>& M, T* params, T* act, const T* y, T* d_params, T* d_act,
                   T* opt_state, const double* opt_cfg, long step, int B, std::uint64_t seed,
                   const long* tensor_steps, const T* w) {
  using R = Runtime<T>;
  if (M.FUSED_TRAIN_STEP && !tensor_steps && !w && B <= FUSED_UPDATE_MAX_BATCH &&
      R::threads_for(M, B) == 1)
    return R::train_chunk(M, params, act, y, d_params, d_act, opt_state, opt_cfg, step, B, seed);
  const T L = model_loss_and_grad(M, params, act, y, d_params, d_act, B, 1, seed, 0, w);
  model_optim_update(M, params, d_params, opt_state, opt_cfg, step, tensor_steps);
  return L;
}

} // namespace rootclad

#endif // ROOTCLAD_MODEL_RUNTIME_IMPL_H
