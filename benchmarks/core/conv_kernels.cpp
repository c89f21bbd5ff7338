// The GW CNN's three Conv1d layers, float32, one thread: rootclad's direct stride-1 kernels
// (conv1d_s1.h) next to im2col + OpenBLAS sgemm (the forward rootclad used before them,
// built from the same kernels.h pieces), and the backward pass over nonzero output
// gradients only (conv1d_sparse.h) at several fractions of nonzeros, against the dense one.
// Prints one JSON object; run by bench_conv_kernels.py.
//
// usage: conv_kernels B REPS
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "rootclad/kernels.h"

using namespace rootclad;

template <class F> static double median_ms(F f, int reps) {
  f(); // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  const int B = argc > 1 ? std::atoi(argv[1]) : 4;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 21;
  const int layers[3][4] = {{1, 2048, 16, 16}, {16, 508, 32, 8}, {32, 125, 64, 8}}; // C L OC K
  std::mt19937 gen(1);
  std::normal_distribution<float> nd;
  std::printf("{\"batch\": %d, \"layers\": [", B);
  for (int i = 0; i < 3; ++i) {
    const int C = layers[i][0], L = layers[i][1], OC = layers[i][2], K = layers[i][3];
    const int LO = L - K + 1;
    std::vector<float> x((long)B * C * L), w((long)OC * C * K), bias(OC), out((long)B * OC * LO),
        g((long)B * OC * LO), dx((long)B * C * L), dw(w.size()), db(OC), cols((long)C * K * B * LO),
        tmp((long)OC * B * LO);
    for (auto* v : {&x, &w, &bias, &g})
      for (auto& e : *v)
        e = nd(gen);
    const double gflop = 2.0 * B * OC * LO * C * K / 1e9; // one pass
    const double fwd = median_ms(
        [&] {
          conv_s1::forward(out.data(), x.data(), w.data(), bias.data(), B, C, L, OC, K, 0, 1, LO);
        },
        reps);
    const double dweight = median_ms(
        [&] {
          conv_s1::backward((float*)nullptr, dw.data(), db.data(), g.data(), x.data(), w.data(), B,
                            C, L, OC, K, 0, 1, LO);
        },
        reps);
    const double both = median_ms(
        [&] {
          conv_s1::backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), B, C, L,
                            OC, K, 0, 1, LO);
        },
        reps);
    const long NL = (long)B * LO;
    const double im2col = median_ms(
        [&] {
          conv1d_im2col(cols.data(), x.data(), B, C, L, K, 1, 0, 1, LO);
          gemm(false, false, OC, (int)NL, C * K, 1.0f, w.data(), C * K, cols.data(), (int)NL, 0.0f,
               tmp.data(), (int)NL);
          for (int b = 0; b < B; ++b)
            for (int o = 0; o < OC; ++o)
              for (int l = 0; l < LO; ++l)
                out[((long)b * OC + o) * LO + l] = tmp[o * NL + (long)b * LO + l] + bias[o];
        },
        reps);
    // Output gradients with one nonzero per window of `every` positions, at a random place
    // in it (what a max-pool of that size leaves), then the sparse backward pass of both
    // gradients; every = 1 is the dense gradient.
    std::printf("%s{\"C\": %d, \"L\": %d, \"OC\": %d, \"K\": %d, \"gflop_per_pass\": %.6g, "
                "\"ms\": {\"direct_forward\": %.6g, \"direct_d_weight\": %.6g, "
                "\"direct_d_input\": %.6g, \"im2col_sgemm_forward\": %.6g}, "
                "\"sparse_backward_ms\": {",
                i ? ", " : "", C, L, OC, K, gflop, fwd, dweight, both - dweight, im2col);
    const int everys[] = {1, 2, 3, 4, 8};
    for (int v = 0; v < 5; ++v) {
      const int every = everys[v];
      std::vector<float> gs(g.size(), 0.0f);
      std::uniform_int_distribution<int> at(0, every - 1);
      for (long r = 0; r < (long)B * OC; ++r)
        for (int l0 = 0; l0 + every <= LO; l0 += every)
          gs[r * LO + l0 + at(gen)] = nd(gen);
      const double sparse = median_ms(
          [&] {
            conv_sparse::backward_any(dx.data(), dw.data(), db.data(), gs.data(), x.data(),
                                      w.data(), B, C, L, OC, K, 1, 0, 1, LO);
          },
          reps);
      std::printf("%s\"1/%d\": %.6g", v ? ", " : "", every, sparse);
    }
    std::printf("}}");
  }
  std::printf("]}\n");
  return 0;
}
