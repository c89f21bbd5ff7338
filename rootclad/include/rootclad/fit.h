// rootclad/fit.h — the training loop of rootclad.fit (Python) in C++: epochs over a reader of
// tree_reader.h, the validation loss after each, early stopping, the best epoch's weights
// restored at the end, one line per epoch.
//
//   rootclad::Model m("build/gwnet");
//   rootclad::data::BatchReader train({"gw.root"}), val({"gw.root"});
//   train.configure(64, "train", 0.2, true, 7);
//   val.configure(64, "validation", 0.2, false, 7);
//   rootclad::Adam opt(m, 1e-3);
//   rootclad::FitOptions o;
//   o.epochs = 20;
//   o.patience = 3;                        // stop after 3 epochs without a better loss
//   rootclad::FitResult r = rootclad::fit(m, opt, train, val, o);
//   // r.history[i].train_loss, .val_loss, .lr, ...; r.best_epoch; m holds its weights
//
// The readers' batches are rootclad.data's (tree_reader.h), so with the same settings this gives
// the history rootclad.fit gives in Python (tested). A TableReader's event weights reach
// train_step and the validation loss, normalised by m.weight_norm(). Losses are those of one
// batch of the whole epoch: the batches' losses weighted by their events (by their sums of
// weights under "sum_w"). An on_epoch_end(const FitEpoch&) functor runs after each epoch (a
// learning-rate schedule: opt.config.lr = ...); returning true stops the fit.
//
// fit_loop() is the loop alone, for any trainer with the methods of ModelTrainer (the LibTorch
// macro trains through it). Everything is a template or inline, nothing static: Cling unloads
// and reads this header again when a macro runs twice (no std::function from a lambda).
#ifndef ROOTCLAD_FIT_H
#define ROOTCLAD_FIT_H

#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "model.h"
#include "tree_reader.h"

namespace rootclad {

struct FitOptions {
  int epochs = 10;
  int patience = 0;         // epochs without improvement before stopping; 0: never stop early
  double min_delta = 0;     // an improvement: a loss below the best by more than this
  bool restore_best = true; // end with the best epoch's weights
  bool verbose = true;      // one line per epoch on stdout
};

// One epoch of the history, as rootclad.fit's dicts; val_loss NaN without validation.
struct FitEpoch {
  int epoch = 0; // 1-based
  double train_loss = NAN, val_loss = NAN, lr = NAN, seconds = 0, events_per_s = 0;
};

struct FitResult {
  std::vector<FitEpoch> history;
  int best_epoch = 0; // 1-based; 0: no epoch had a finite monitored loss
  double best_loss = INFINITY;
  bool stopped_early = false;
};

namespace detail {

// Never stops the fit.
struct NoEpochCallback {
  bool operator()(const FitEpoch&) const { return false; }
};

// A batch of a reader as floats: x (B, length), y (B,) targets, w (B,) weights when weighted.
struct FitBatch {
  std::vector<float> x, y, w;
  std::vector<int> labels;
  bool weighted = false;

  void size_for(const data::RowBatcher& r) {
    x.resize(r.batch_size() * r.length());
    y.resize(r.batch_size());
    w.resize(r.batch_size());
    labels.resize(r.batch_size());
    weighted = r.weighted();
  }
  long long next(data::BatchReader& r) { return as_float(r.next_batch(x.data(), labels.data())); }
  long long next(data::TableReader& r) {
    float* wp = weighted ? w.data() : nullptr;
    if (!r.integral_target())
      return r.next_batch(x.data(), y.data(), wp);
    return as_float(r.next_batch(x.data(), labels.data(), wp));
  }
  long long as_float(long long n) {
    for (long long i = 0; i < n; ++i)
      y[i] = (float)labels[i];
    return n;
  }
};

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

} // namespace detail

// rootclad::Model, its optimizer and readers (BatchReader or TableReader) as fit_loop's trainer.
template <class Reader> class ModelTrainer {
public:
  ModelTrainer(Model& m, Optimizer& opt, Reader& train, Reader* validation)
      : m_(m), opt_(opt), train_(train), val_(validation) {
    check(train, "training");
    if (val_)
      check(*val_, "validation");
  }

  // One pass of training steps over epoch `epoch`: the epoch's loss; `events` read.
  double train_epoch(int epoch, long long& events) { return pass(train_, epoch, &opt_, events); }
  bool has_validation() const { return val_ != nullptr; }
  double validation_loss() {
    long long events = 0;
    return pass(*val_, 0, nullptr, events);
  }
  std::vector<double> weights() const { return m_.parameters(); }
  void set_weights(const std::vector<double>& p) { m_.set_parameters(p); }
  double lr() const { return opt_.config.lr; }

private:
  void check(const Reader& r, const char* which) const {
    if (r.length() != m_.input_size())
      throw std::runtime_error("rootclad::fit: the " + std::string(which) + " rows hold " +
                               std::to_string(r.length()) + " values; the model " + m_.stem() +
                               " takes " + std::to_string(m_.input_size()));
    const bool classes = m_.loss() == "cross_entropy" || m_.loss() == "nll";
    if (!classes && m_.output_size() != 1)
      throw std::runtime_error("rootclad::fit: the readers give one target per entry; the "
                               "model's loss reads " +
                               std::to_string(m_.output_size()) + " outputs");
  }

  // Sets the model's weight_norm for a scope, and puts it back (also when the loss throws).
  struct NormAs {
    Model& m;
    std::string was;
    NormAs(Model& model, const std::string& norm) : m(model), was(model.weight_norm()) {
      m.set_weight_norm(norm);
    }
    ~NormAs() { m.set_weight_norm(was); }
  };

  double pass(Reader& r, int epoch, Optimizer* opt, long long& events) {
    batch_.size_for(r);
    r.start_epoch(epoch);
    const bool sum_w = m_.weight_norm() == "sum_w";
    double total = 0, norm = 0;
    events = 0;
    while (long long n = batch_.next(r)) {
      const float* w = batch_.weighted ? batch_.w.data() : nullptr;
      double wsum = (double)n; // what the batch's loss is normalised by
      if (w && sum_w) {
        wsum = 0;
        for (long long i = 0; i < n; ++i)
          wsum += (double)w[i];
      }
      if (opt) {
        total += m_.train_step(batch_.x.data(), batch_.y.data(), (int)n, *opt, w) * wsum;
      } else {
        // validation: sum w * loss over all batches, divided once by all their weights (a
        // batch whose weights sum to 0 is fine here; "mean" gives sum(w * loss) / n)
        NormAs mean(m_, "mean");
        total += m_.loss(batch_.x.data(), batch_.y.data(), (int)n, w) * (double)n;
      }
      norm += wsum;
      events += n;
    }
    if (events == 0 || norm == 0)
      throw std::runtime_error(std::string("rootclad::fit: the ") +
                               (opt ? "training" : "validation") +
                               " reader gave no entries (or weights summing to 0)");
    return total / norm;
  }

  Model& m_;
  Optimizer& opt_;
  Reader& train_;
  Reader* val_;
  detail::FitBatch batch_;
};

// The loop: up to o.epochs passes of t.train_epoch(epoch, events), t.validation_loss() after
// each when t.has_validation() (else the training loss is monitored), early stopping after
// o.patience epochs without improvement (checked before an epoch starts, as in Python), the
// best weights (t.weights()) restored at the end with t.set_weights().
template <class Trainer, class OnEpochEnd>
FitResult fit_loop(Trainer& t, const FitOptions& o, OnEpochEnd&& on_epoch_end) {
  if (o.patience < 0 || !(o.min_delta >= 0))
    throw std::invalid_argument("rootclad::fit: patience and min_delta must be >= 0");
  FitResult r;
  std::vector<double> best;
  int bad = 0;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    if (o.patience > 0 && bad >= o.patience) {
      r.stopped_early = true;
      break;
    }
    FitEpoch e;
    e.epoch = epoch + 1;
    e.lr = t.lr();
    long long events = 0;
    const double t0 = detail::now_seconds();
    e.train_loss = t.train_epoch(epoch, events);
    e.seconds = detail::now_seconds() - t0;
    e.events_per_s = e.seconds > 0 ? events / e.seconds : 0;
    if (t.has_validation())
      e.val_loss = t.validation_loss();
    const double monitored = t.has_validation() ? e.val_loss : e.train_loss;
    if (monitored < r.best_loss - o.min_delta) {
      r.best_loss = monitored;
      r.best_epoch = e.epoch;
      bad = 0;
      if (o.restore_best)
        best = t.weights();
    } else {
      ++bad;
    }
    r.history.push_back(e);
    if (o.verbose) {
      printf("epoch %d: train loss %.6f", e.epoch, e.train_loss);
      if (t.has_validation())
        printf(", validation loss %.6f", e.val_loss);
      printf(", %.0f events/s, %.1f s\n", e.events_per_s, e.seconds);
      fflush(stdout);
    }
    if (on_epoch_end(r.history.back())) {
      r.stopped_early = epoch + 1 < o.epochs;
      break;
    }
  }
  if (o.restore_best && !best.empty())
    t.set_weights(best);
  return r;
}

template <class Trainer> FitResult fit_loop(Trainer& t, const FitOptions& o) {
  return fit_loop(t, o, detail::NoEpochCallback());
}

// rootclad.fit for rootclad::Model: with a validation reader, or without (the training loss is
// then monitored); on_epoch_end optional. (References, not pointers: PyROOT deduces Reader.)
template <class Reader, class OnEpochEnd>
FitResult fit(Model& m, Optimizer& opt, Reader& train, Reader& validation, const FitOptions& o,
              OnEpochEnd&& on_epoch_end) {
  ModelTrainer<Reader> t(m, opt, train, &validation);
  return fit_loop(t, o, on_epoch_end);
}
template <class Reader>
FitResult fit(Model& m, Optimizer& opt, Reader& train, Reader& validation,
              const FitOptions& o = FitOptions()) {
  return fit(m, opt, train, validation, o, detail::NoEpochCallback());
}
template <class Reader, class OnEpochEnd>
FitResult fit(Model& m, Optimizer& opt, Reader& train, const FitOptions& o,
              OnEpochEnd&& on_epoch_end) {
  ModelTrainer<Reader> t(m, opt, train, nullptr);
  return fit_loop(t, o, on_epoch_end);
}
template <class Reader>
FitResult fit(Model& m, Optimizer& opt, Reader& train, const FitOptions& o = FitOptions()) {
  return fit(m, opt, train, o, detail::NoEpochCallback());
}

} // namespace rootclad

#endif // ROOTCLAD_FIT_H
