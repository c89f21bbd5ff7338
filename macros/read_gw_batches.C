// Read shuffled training batches of whitened strain from GW dataset files, in C++ only.
//
//   root -b -q 'macros/read_gw_batches.C("signal.root,noise.root", 256, 2)'
//   root -b -q 'macros/read_gw_batches.C("gw.root", 256, 1, "train", 0.2, 7)'
//
// Arguments: comma-separated files, batch size, epochs, split ("all", "train",
// "validation"), validation fraction, seed. Prints per epoch the entries,
// batches, throughput and a checksum that depends on the order of entries,
// sum over positions p of (p + 1) * (x[p][0] + label[p]), the same number the
// Python iterators give for the same files and settings.
//
// The reader is rootclad/include/rootclad/tree_reader.h, included relative to
// this macro; a C++ training loop uses it the same way: configure once, then
// start_epoch / next_batch into its own buffers.
#include "../rootclad/include/rootclad/tree_reader.h"

#include <TStopwatch.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

int read_gw_batches(const char* files = "gw.root", int batch_size = 256, int epochs = 1,
                    const char* split = "all", double validation_fraction = 0.0,
                    unsigned long long seed = 0) {
  try {
    rootclad::data::BatchReader reader(rootclad::data::file_list(files));
    reader.configure(batch_size, split, validation_fraction, /*shuffle=*/true, seed);
    const long long N = reader.length();
    std::vector<float> x(batch_size * N);
    std::vector<int> y(batch_size);
    for (int epoch = 0; epoch < epochs; ++epoch) {
      TStopwatch clock;
      reader.start_epoch(epoch);
      long long entries = 0, batches = 0;
      double checksum = 0;
      while (long long n = reader.next_batch(x.data(), y.data())) {
        for (long long i = 0; i < n; ++i)
          checksum += double(entries + i + 1) * (double(x[i * N]) + double(y[i]));
        entries += n;
        ++batches;
      }
      const double seconds = clock.RealTime();
      std::printf("epoch %d: entries %lld batches %lld length %lld MB/s %.1f checksum %.17g\n",
                  epoch, entries, batches, N, entries * N * 4.0 / 1e6 / seconds, checksum);
    }
  } catch (const std::exception& e) {
    std::cerr << "read_gw_batches: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
