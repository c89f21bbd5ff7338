// rootclad/parallel.h — a small persistent thread pool for batch-parallel training steps.
//
// A compiled model splits a batch into one chunk per thread; each thread runs the whole
// forward and backward pass on its chunk with single-threaded BLAS, and the parameter
// gradients are summed afterwards. Every op (im2col, pooling, activations) is then parallel,
// not only the GEMMs. The pool is created on first use and reused, so a training step
// allocates nothing after the first call. The pool lives in the runtime library, one per
// runtime library and process: every model linked to it shares it, their steps taking turns.
// Its statics must never bind to another runtime library's (two libraries' ThreadPool::run and
// gemm with different in_pool_task flags deadlocked): the runtime is built with
// -fno-gnu-unique by g++, so its symbols stay under its own version, and a model library or
// an export keeps its copies hidden. ROOTCLAD_NUM_THREADS overrides the thread count when the
// pool is made (default: the hardware's).
#ifndef ROOTCLAD_PARALLEL_H
#define ROOTCLAD_PARALLEL_H

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

// rootclad's parallelism is its own: the OpenBLAS it links is set to one thread when the pool
// starts. Measured here (2 vCPUs with steal time), OpenBLAS's own threads made small GEMMs
// several times slower and erratic, and switching its thread count on every call cost ~5 ms.
#if defined(ROOTCLAD_CBLAS_SCIPY)
extern "C" void scipy_openblas_set_num_threads(int);
extern "C" int scipy_openblas_get_num_threads(void);
#define ROOTCLAD_BLAS_GET_THREADS() scipy_openblas_get_num_threads()
#define ROOTCLAD_BLAS_SET_THREADS(n) scipy_openblas_set_num_threads(n)
#else
#define ROOTCLAD_BLAS_GET_THREADS() 0
#define ROOTCLAD_BLAS_SET_THREADS(n) (void)0
#endif

namespace rootclad {

// The most threads a pool runs: a batch is split into at most this many chunks (the
// generated Job keeps one loss per chunk), and more would only oversubscribe a node.
constexpr int MAX_THREADS = 256;

// ROOTCLAD_NUM_THREADS when it is a count from 1 to MAX_THREADS, else the hardware's (capped).
// Python checks the variable and names it when it is wrong (rootclad.compiler.num_threads);
// here a bad value must not end the host process, so it is ignored or capped.
inline int default_num_threads() {
  if (const char* env = std::getenv("ROOTCLAD_NUM_THREADS")) {
    char* end = nullptr;
    long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0)
      return n < MAX_THREADS ? (int)n : MAX_THREADS;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : (hw < (unsigned)MAX_THREADS ? (int)hw : MAX_THREADS);
}

// True on a thread while it runs its share of a parallel call (always on the pool's own
// threads): a kernel asked to split its work (gemm in blas.h) then runs it whole instead.
inline bool& in_pool_task() {
  static thread_local bool flag = false;
  return flag;
}

class ThreadPool {
public:
  using Task = void (*)(void* ctx, int thread, int n_threads);

  static ThreadPool& instance() {
    static ThreadPool pool(default_num_threads());
    return pool;
  }

  int size() const { return (int)workers_.size() + 1; }

  // Runs task(ctx, t, n) for t = 0..n-1, t = 0 on the calling thread; returns when all are done.
  // n is capped at size().
  void run(Task task, void* ctx, int n) {
    if (n > size())
      n = size();
    if (n <= 1) {
      task(ctx, 0, 1);
      return;
    }
    std::unique_lock<std::mutex> call(call_mutex_); // one parallel call at a time
    remaining_.store(n - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lk(m_);
      task_ = task;
      ctx_ = ctx;
      n_ = n;
      generation_.fetch_add(1, std::memory_order_release);
    }
    if (sleeping_.load(std::memory_order_acquire) > 0)
      cv_.notify_all();
    in_pool_task() = true;
    task(ctx, 0, n);
    in_pool_task() = false;
    // the workers' shares take about as long as this thread's: wait for them spinning
    for (int spins = 0; remaining_.load(std::memory_order_acquire) != 0; ++spins)
      spins < SPIN_PAUSES ? cpu_pause() : std::this_thread::yield();
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_)
      w.join();
  }

private:
  // A worker that has just finished a task spins this long for the next one before it
  // sleeps on the condition variable. Waking a sleeping thread took 20-40 us on these 2-vCPU
  // machines (a batch-1 forward split over two threads ran 2.5x slower than on one); a
  // spinning one starts in well under a microsecond, as OpenBLAS's and onnxruntime's do.
  static constexpr long SPIN_NS = 200000;
  static constexpr int SPIN_PAUSES = 4096;
  static void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  explicit ThreadPool(int n) {
    if (ROOTCLAD_BLAS_GET_THREADS() > 1)
      ROOTCLAD_BLAS_SET_THREADS(1);
    for (int t = 1; t < n; ++t) {
      try {
        workers_.emplace_back([this, t] { loop(t); });
      } catch (const std::system_error&) { // the system refused a thread: run with fewer
        break;
      }
    }
    const int started = (int)workers_.size();
    // Returns once every worker runs: a thread's first use of this library's thread-locals
    // makes the dynamic loader allocate them (the library is dlopen'ed), and that must not
    // happen later, inside a training step (tests/test_no_alloc.py caught it, under load).
    std::unique_lock<std::mutex> lk(m_);
    started_cv_.wait(lk, [&] { return started_ == started; });
  }

  // Waits for a generation other than `seen`: spinning for SPIN_NS, then asleep.
  void wait_for_work(long seen) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(SPIN_NS);
    for (int spins = 1;; ++spins) {
      if (generation_.load(std::memory_order_acquire) != seen)
        return;
      cpu_pause();
      if (spins % 256 == 0 && std::chrono::steady_clock::now() > until)
        break;
    }
    std::unique_lock<std::mutex> lk(m_);
    sleeping_.fetch_add(1, std::memory_order_acq_rel);
    cv_.wait(lk, [&] { return stop_ || generation_.load(std::memory_order_relaxed) != seen; });
    sleeping_.fetch_sub(1, std::memory_order_acq_rel);
  }

  void loop(int t) {
    in_pool_task() = true;
    {
      std::lock_guard<std::mutex> lk(m_);
      ++started_;
    }
    started_cv_.notify_all();
    long seen = 0;
    for (;;) {
      wait_for_work(seen);
      Task task;
      void* ctx;
      int n;
      {
        // task, ctx and n are read with the generation they belong to: a worker that
        // wakes late may skip a call it takes no part in, never run one twice
        std::lock_guard<std::mutex> lk(m_);
        if (stop_)
          return;
        seen = generation_.load(std::memory_order_relaxed);
        task = task_;
        ctx = ctx_;
        n = n_;
      }
      if (t < n) {
        task(ctx, t, n);
        remaining_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex call_mutex_, m_;
  std::condition_variable cv_, started_cv_;
  Task task_ = nullptr;
  void* ctx_ = nullptr;
  int n_ = 0, started_ = 0;
  std::atomic<int> remaining_{0}, sleeping_{0};
  std::atomic<long> generation_{0};
  bool stop_ = false;
};

// [begin, end) of chunk t when n items are split into `parts` nearly equal chunks.
inline void chunk_range(int n, int parts, int t, int& begin, int& end) {
  int base = n / parts, extra = n % parts;
  begin = t * base + (t < extra ? t : extra);
  end = begin + base + (t < extra ? 1 : 0);
}

} // namespace rootclad

namespace rootclad {

// The chunks of one batch, run side by side by ThreadPool::run, meeting inside an op that
// needs the statistics of the whole batch (BatchNorm in training mode): each chunk adds its
// partial sums to its own slot of `values`, all wait at the barrier, then each combines the
// slots. Task t of a parallel call runs on its own thread, so all n chunks are live at once.
struct ChunkSync {
  int t = 0, n = 1;
  double* values = nullptr; // n slots of `slot` values, shared by the chunks
  long slot = 0;
  std::atomic<int>* arrived = nullptr; // the barrier: threads arrived in this generation
  std::atomic<int>* generation = nullptr;

  // Waits until all n chunks have called it (the same number of times).
  void barrier() const {
    const int gen = generation->load(std::memory_order_acquire);
    if (arrived->fetch_add(1, std::memory_order_acq_rel) == n - 1) {
      arrived->store(0, std::memory_order_relaxed);
      generation->fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    while (generation->load(std::memory_order_acquire) == gen)
      std::this_thread::yield();
  }
  // v[i * stride] = the sum over all chunks of their v[i * stride], i < count (<= slot).
  // Two barriers: the slots are free for the next reduction once every chunk has read them.
  template <typename T> void all_reduce(T* v, long count, long stride = 1) const {
    double* mine = values + (long)t * slot;
    for (long i = 0; i < count; ++i)
      mine[i] = (double)v[i * stride];
    barrier();
    for (long i = 0; i < count; ++i) {
      double s = 0;
      for (int k = 0; k < n; ++k)
        s += values[(long)k * slot + i];
      v[i * stride] = (T)s;
    }
    barrier();
  }
};

// The ChunkSync of the batch this thread is running a chunk of, or null (one chunk).
inline const ChunkSync*& chunk_sync() {
  static thread_local const ChunkSync* sync = nullptr;
  return sync;
}

// Sets this thread's chunk_sync() while it lives.
struct ChunkSyncScope {
  explicit ChunkSyncScope(const ChunkSync* s) { chunk_sync() = s; }
  ~ChunkSyncScope() { chunk_sync() = nullptr; }
  ChunkSyncScope(const ChunkSyncScope&) = delete;
  ChunkSyncScope& operator=(const ChunkSyncScope&) = delete;
};

} // namespace rootclad

#endif // ROOTCLAD_PARALLEL_H
