// The C++ reader compiled ahead of time (g++ -O2), without Python or Cling:
// what a C++ training loop sees. Built and run by bench_readers.py.
//
//   bench_reader <batch_size> <epochs> <file> [<file> ...]
//
// Prints one line per epoch: "epoch <e> entries <n> seconds <s> MB/s <r>".
#include "rootclad/tree_reader.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s batch_size epochs file...\n", argv[0]);
    return 2;
  }
  const long long batch = std::atoll(argv[1]);
  const int epochs = std::atoi(argv[2]);
  std::vector<std::string> files(argv + 3, argv + argc);
  try {
    rootclad::data::BatchReader reader(files);
    reader.configure(batch, "all", 0.0, /*shuffle=*/true, /*seed=*/1);
    const long long N = reader.length();
    std::vector<float> x(batch * N);
    std::vector<int> y(batch);
    for (int e = 0; e < epochs; ++e) {
      const auto t0 = std::chrono::steady_clock::now();
      reader.start_epoch(e);
      long long entries = 0;
      while (long long n = reader.next_batch(x.data(), y.data()))
        entries += n;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("epoch %d entries %lld seconds %.4f MB/s %.1f\n", e, entries, s,
                  entries * N * 4.0 / 1e6 / s);
    }
  } catch (const std::exception& err) {
    std::fprintf(stderr, "bench_reader: %s\n", err.what());
    return 1;
  }
  return 0;
}
