// Train an exported rootclad model on a GW dataset file, in C++ only (no Python, no torch).
//
//   root -l -b -q 'macros/train_gw.C("gw.root", "build/gwnet", 5)'
//   root -l -b -q 'macros/train_gw.C+("gw.root", "build/gwnet", 5)'      // compiled by ACLiC
//
// Arguments: comma-separated dataset files (TTree "events": strain[N]/F, label/I, as written by
// `rootclad gw simulate`), the model's stem (cm.export(stem) wrote stem.so and stem.root),
// epochs, batch size, learning rate (Adam), validation fraction, seed. Batches come from
// rootclad/tree_reader.h (the plan and shuffle of rootclad.data, so a Python loop over
// rootclad.data.compiled.CompiledBatchIterator with the same settings sees the same batches);
// each step is rootclad::Model::train_step: forward, the Clad or pullback backward and the
// Adam update in the model's library. Prints the train and validation loss per epoch and
// saves the weights back to stem.root (written to a temporary name, then renamed).
#include "../rootclad/include/rootclad/model.h"
#include "../rootclad/include/rootclad/tree_reader.h"
#include "gw_training.h"

#include <cstdio>
#include <string>
#include <vector>

namespace {
// Mean loss over one pass of `reader` (training steps when opt is given).
double run_epoch(rootclad::Model& m, rootclad::data::BatchReader& reader, unsigned long long epoch,
                 rootclad::Optimizer* opt) {
  std::vector<float> y(reader.batch_size());
  return gw_training::mean_loss(reader, epoch, [&](const float* x, const int* labels, long long n) {
    for (long long i = 0; i < n; ++i)
      y[i] = (float)labels[i];
    return opt ? m.train_step(x, y.data(), (int)n, *opt) : m.loss(x, y.data(), (int)n);
  });
}
} // namespace

int train_gw(const char* files = "gw.root", const char* stem = "build/gwnet", int epochs = 5,
             int batch_size = 64, double lr = 1e-3, double validation_fraction = 0.2,
             unsigned long long seed = 0) {
  try {
    rootclad::Model m(stem);
    if (m.input_size() <= 0 || m.output_size() != 1)
      throw std::runtime_error(std::string(stem) + " is not a one-output classifier");
    rootclad::data::BatchReader train(rootclad::data::file_list(files)),
        val(rootclad::data::file_list(files));
    gw_training::configure(train, val, batch_size, validation_fraction, seed, m.input_size(), stem);
    rootclad::Adam opt(m, lr);
    printf("training %s (%s engine, %s) on %lld events, validating on %lld\n", stem,
           m.engine().c_str(), m.dtype().c_str(), train.entries(), val.entries());
    gw_training::train_epochs(epochs, train, val, [&](auto& reader, int epoch, bool training) {
      return run_epoch(m, reader, epoch, training ? &opt : nullptr);
    });
    m.save(std::string(stem) + ".root", &opt); // with Adam's state: training can resume
    printf("saved the weights to %s.root\n", stem);
  } catch (const std::exception& e) {
    fprintf(stderr, "train_gw: %s\n", e.what());
    return 1;
  }
  return 0;
}
