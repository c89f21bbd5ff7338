// What the GW training macros (train_gw.C, train_libtorch.C) share: the training and
// validation readers of a file list, the mean loss of one pass over a reader, the epoch loop.
#ifndef ROOTCLAD_MACROS_GW_TRAINING_H
#define ROOTCLAD_MACROS_GW_TRAINING_H

#include "../rootclad/include/rootclad/tree_reader.h"

#include <TStopwatch.h>

#include <cstdio>

#include <stdexcept>
#include <string>
#include <vector>

namespace gw_training {

// Configures `train` (shuffled) and `val` on the same files (the last validation_fraction of
// each file is validation) and checks the strain length against the model's input.
inline void configure(rootclad::data::BatchReader& train, rootclad::data::BatchReader& val,
                      int batch_size, double validation_fraction, unsigned long long seed,
                      long model_input, const std::string& stem) {
  train.configure(batch_size, "train", validation_fraction, /*shuffle=*/true, seed);
  val.configure(batch_size, "validation", validation_fraction, /*shuffle=*/false, seed);
  if (train.length() != model_input)
    throw std::runtime_error("the strain has " + std::to_string(train.length()) +
                             " samples; the model " + stem + " takes " +
                             std::to_string(model_input));
}

// The mean over one pass of `reader` (epoch `epoch`) of step(x, labels, n), the loss of a
// batch of n rows: x (n, N) floats, labels (n) ints.
template <class Step>
double mean_loss(rootclad::data::BatchReader& reader, unsigned long long epoch, Step&& step) {
  const long long B = reader.batch_size(), N = reader.length();
  std::vector<float> x(B * N);
  std::vector<int> labels(B);
  reader.start_epoch(epoch);
  double total = 0;
  long long seen = 0;
  while (long long n = reader.next_batch(x.data(), labels.data())) {
    total += step(x.data(), labels.data(), n) * n;
    seen += n;
  }
  return seen ? total / seen : 0.0;
}

// `epochs` passes: epoch_loss(reader, epoch, training) is the mean loss of one pass, with
// optimizer steps when training; prints the training and validation loss of each epoch.
template <class EpochLoss>
void train_epochs(int epochs, rootclad::data::BatchReader& train, rootclad::data::BatchReader& val,
                  EpochLoss&& epoch_loss) {
  for (int epoch = 0; epoch < epochs; ++epoch) {
    TStopwatch clock;
    const double train_loss = epoch_loss(train, epoch, true);
    const double val_loss = val.entries() ? epoch_loss(val, 0, false) : 0.0;
    printf("epoch %d: train loss %.6f, validation loss %.6f, %.1f s\n", epoch + 1, train_loss,
           val_loss, clock.RealTime());
  }
}

} // namespace gw_training

#endif
