// Train an exported rootclad model on a GW dataset file, in C++ only (no Python, no torch).
//
//   root -l -b -q 'macros/train_gw.C("gw.root", "build/gwnet", 5)'
//   root -l -b -q 'macros/train_gw.C+("gw.root", "build/gwnet", 5)'      // compiled by ACLiC
//
// Arguments: comma-separated dataset files (TTree "events": strain[N]/F, label/I, as written by
// `rootclad gw simulate`), the model's stem (cm.export(stem) wrote stem.so and stem.root),
// epochs, batch size, learning rate (Adam), validation fraction, seed, patience. Batches come
// from rootclad/tree_reader.h (the plan and shuffle of rootclad.data, so a Python loop over
// rootclad.data.compiled.CompiledBatchIterator with the same settings sees the same batches);
// the loop is rootclad/fit.h's, rootclad.fit's twin: each step is rootclad::Model::train_step
// (forward, the Clad or pullback backward and the Adam update in the model's library), the
// validation loss after each epoch. With patience > 0 training stops after that many epochs
// without a better validation loss and the best epoch's weights are kept; with 0 (the default)
// every epoch runs and the last weights are kept. The weights and Adam's state are saved back
// to stem.root (written to a temporary name, then renamed).
#include "../rootclad/include/rootclad/fit.h"
#include "../rootclad/include/rootclad/model.h"
#include "../rootclad/include/rootclad/tree_reader.h"

#include <cstdio>
#include <string>

int train_gw(const char* files = "gw.root", const char* stem = "build/gwnet", int epochs = 5,
             int batch_size = 64, double lr = 1e-3, double validation_fraction = 0.2,
             unsigned long long seed = 0, int patience = 0) {
  try {
    rootclad::Model m(stem);
    if (m.input_size() <= 0 || m.output_size() != 1)
      throw std::runtime_error(std::string(stem) + " is not a one-output classifier");
    const auto names = rootclad::data::file_list(files);
    rootclad::data::BatchReader train(names), val(names);
    train.configure(batch_size, "train", validation_fraction, /*shuffle=*/true, seed);
    val.configure(batch_size, "validation", validation_fraction, /*shuffle=*/false, seed);
    rootclad::Adam opt(m, lr);
    printf("training %s (%s engine, %s) on %lld events, validating on %lld\n", stem,
           m.engine().c_str(), m.dtype().c_str(), train.entries(), val.entries());
    rootclad::FitOptions o;
    o.epochs = epochs;
    o.patience = patience;
    o.restore_best = patience > 0;
    const rootclad::FitResult r =
        val.entries() ? rootclad::fit(m, opt, train, val, o) : rootclad::fit(m, opt, train, o);
    if (r.stopped_early)
      printf("stopped early: no better validation loss after epoch %d\n", r.best_epoch);
    if (o.restore_best && r.best_epoch > 0)
      printf("kept the weights of epoch %d\n", r.best_epoch);
    // Adam's state belongs to the last epoch's weights: saved with them (training can resume),
    // not with an earlier epoch's restored weights (a state no run ever had)
    const bool last = !o.restore_best || r.best_epoch == (int)r.history.size();
    m.save(std::string(stem) + ".root", last ? &opt : nullptr);
    printf("saved the weights to %s.root%s\n", stem,
           last ? " with Adam's state" : " (without Adam's state: not the last epoch's weights)");
  } catch (const std::exception& e) {
    fprintf(stderr, "train_gw: %s\n", e.what());
    return 1;
  }
  return 0;
}
