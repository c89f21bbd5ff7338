// rootclad/evaluate.h — rootclad.root.evaluate's numbers for macros and programs: an exported
// classifier's ROC and its integral (AUC), the overtraining check (train against test score
// distributions, TH1::KolmogorovTest) and the efficiencies against the cut, written as the
// ROOT objects the Python evaluation writes (TH1D score_<split>_<class>, TGraph roc,
// TEfficiency efficiency_<class>, the summary as JSON in the TObjString rootclad_evaluation).
// And the input columns ranked by the compiled model's input gradient (TH1D importance_input);
// the ranking by permutation, the AUC's bootstrap error and the plots are the Python one's.
//
//   rootclad::Model m("build/net");                       // an export with its input columns
//   auto ev = rootclad::evaluate(m, {"sig_test.root", "events", "w"},
//                                {"bkg_test.root", "events", "w"}, "net_evaluation.root",
//                                {"sig_train.root", "events", "w"}, {"bkg_train.root", "events",
//                                "w"});
//   printf("AUC %.4f, KS signal %.3f\n", ev.auc, ev.ks_signal);
//
// The score is the model's first output (larger is more signal-like); the sources are read as
// score_tree reads them (TTrees or RNTuples, the export's input columns, and an optional
// weight column), and the same bad input is refused in the same words.
#ifndef ROOTCLAD_EVALUATE_H
#define ROOTCLAD_EVALUATE_H

#include <TEfficiency.h>
#include <TGraph.h>
#include <TH1.h>
#include <TH1D.h>
#include <TObjString.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "scoring.h"

namespace rootclad {

// A TTree or RNTuple of one file; `weight`: a column of event weights, or "" (all 1)
struct EvaluationSource {
  std::string file, tree = "events", weight;
};

struct Evaluation {
  double auc = 0;
  double ks_signal = -1, ks_background = -1; // -1: no train sources given
  // the ROC: a point per distinct score, from the highest cut down (weighted)
  std::vector<double> roc_signal_efficiency, roc_background_rejection;
  // the cuts (score >= cut passes) and each class's efficiency there
  std::vector<double> cuts, signal_efficiency, background_efficiency;
  // the input columns ranked by the input gradient: per column, the weighted mean over the
  // test events of |d score / d x| times the weighted spread of x, summed over its values
  std::vector<std::string> columns;
  std::vector<double> gradient_importance;
};

namespace detail {

struct ScoredEvents {
  std::vector<double> score, w;
};

// Per input value: sums over events of w, w d, w d^2 (d: x less the first event's x, so that
// a large mean does not cancel the spread) and w |d score / d x|
struct GradientSums {
  double w = 0;
  std::vector<double> shift, x, x2, dx;
};

inline ScoredEvents score_source(Model& m, const EvaluationSource& src, const std::string& what,
                                 GradientSums* sums = nullptr) {
  const std::vector<std::string>& inputs = m.input_columns();
  if (inputs.empty())
    throw std::invalid_argument("rootclad::evaluate: the model " + m.stem() +
                                " stores no input columns (export it with a schema)");
  data::TableSource in(src.file, src.tree, inputs, "", src.weight);
  const std::vector<int> widths = in.widths();
  const long n_in = std::accumulate(widths.begin(), widths.end(), 0L);
  if (n_in != m.input_size())
    in.fail("the columns hold " + std::to_string(n_in) + " values per entry; the model " +
                m.stem() + " takes " + std::to_string(m.input_size()),
            true);
  const long long entries = in.entries();
  if (entries == 0)
    throw std::invalid_argument("rootclad::evaluate: the " + what + " source " + src.file +
                                " (tree '" + src.tree + "') holds no events");
  const long K = m.output_size();
  const int batch = (int)std::min<long long>(m.cache_batch(), entries);
  std::vector<float> x((size_t)batch * n_in), out((size_t)batch * K), w(batch, 1.0f);
  std::vector<float> dx(sums ? x.size() : 0);
  if (sums && sums->x.empty())
    sums->x.assign(n_in, 0.0), sums->x2.assign(n_in, 0.0), sums->dx.assign(n_in, 0.0);
  double sum_w = 0;
  ScoredEvents s;
  for (long long start = 0; start < entries; start += batch) {
    const int n = (int)std::min<long long>(batch, entries - start);
    for (int i = 0; i < n; ++i)
      in.read(start + i, widths, x.data() + (size_t)i * n_in, nullptr,
              src.weight.empty() ? nullptr : &w[i], true);
    m.predict(x.data(), out.data(), n);
    for (int i = 0; i < n; ++i) {
      const double score = out[(size_t)i * K];
      if (!std::isfinite(score))
        throw std::runtime_error("rootclad::evaluate: the model " + m.stem() + " scores entry " +
                                 std::to_string(start + i) + " of the " + what + " source " +
                                 src.file + " " + std::to_string(score));
      s.score.push_back(score);
      s.w.push_back(w[i]);
      sum_w += w[i];
    }
    if (sums) {
      m.input_grad(x.data(), dx.data(), n);
      if (sums->shift.empty())
        sums->shift.assign(x.begin(), x.begin() + n_in);
      for (int i = 0; i < n; ++i) {
        const double wi = w[i];
        sums->w += wi;
        for (long j = 0; j < n_in; ++j) {
          const double v = x[(size_t)i * n_in + j] - sums->shift[j];
          sums->x[j] += wi * v, sums->x2[j] += wi * v * v;
          sums->dx[j] += wi * std::fabs((double)dx[(size_t)i * n_in + j]);
        }
      }
    }
  }
  if (!(sum_w > 0))
    throw std::invalid_argument("rootclad::evaluate: the " + what + " source " + src.file +
                                " has no positive total weight");
  return s;
}

// The weighted ROC at every distinct score (cuts descending), as rootclad.root.roc_curve
inline void roc(const ScoredEvents& s, const ScoredEvents& b, std::vector<double>& sig,
                std::vector<double>& rej) {
  struct Event {
    double score, ws, wb;
  };
  std::vector<Event> all;
  for (size_t i = 0; i < s.score.size(); ++i)
    all.push_back({s.score[i], s.w[i], 0.0});
  for (size_t i = 0; i < b.score.size(); ++i)
    all.push_back({b.score[i], 0.0, b.w[i]});
  std::stable_sort(all.begin(), all.end(),
                   [](const Event& a, const Event& c) { return a.score > c.score; });
  std::vector<double> tps, fps;
  double tp = 0, fp = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    tp += all[i].ws, fp += all[i].wb;
    if (i + 1 == all.size() || all[i + 1].score != all[i].score)
      tps.push_back(tp), fps.push_back(fp);
  }
  sig.assign(1, 0.0), rej.assign(1, 1.0);
  for (size_t k = 0; k < tps.size(); ++k) {
    sig.push_back(tps[k] / tps.back());
    rej.push_back(1.0 - fps[k] / fps.back());
  }
}

// `text` as a JSON string (quotes, backslashes and control characters escaped)
inline std::string json_quoted(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\')
      out += '\\', out += (char)c;
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else
      out += (char)c;
  }
  return out + "\"";
}

inline TH1D* score_histogram(const std::string& name, const std::string& title,
                             const ScoredEvents& s, double lo, double hi, int bins) {
  auto* h = new TH1D(name.c_str(), title.c_str(), bins, lo, hi);
  h->SetDirectory(nullptr);
  h->Sumw2();
  h->FillN((Int_t)s.score.size(), s.score.data(), s.w.data());
  return h;
}

} // namespace detail

// The evaluation of `m` on test sources of each class, written to `output` (whole or not at
// all); with train sources too, the Kolmogorov-Smirnov probability of train against test
// per class. `bins`: score histograms and cuts (50, as the Python evaluation's).
inline Evaluation evaluate(Model& m, const EvaluationSource& signal,
                           const EvaluationSource& background, const std::string& output,
                           const EvaluationSource& train_signal = {"", "", ""},
                           const EvaluationSource& train_background = {"", "", ""}, int bins = 50) {
  if (m.output_size() != 1)
    throw std::invalid_argument("rootclad::evaluate: the model " + m.stem() + " has " +
                                std::to_string(m.output_size()) +
                                " outputs; it evaluates a classifier of one output");
  const bool train = !train_signal.file.empty() && !train_background.file.empty();
  if (train_signal.file.empty() != train_background.file.empty())
    throw std::invalid_argument("rootclad::evaluate: train sources of both classes, or none");
  // the caller's current directory is theirs again after (opening the sources moves it), and
  // the objects made here join no directory (one named as a user's histogram would take its
  // place there)
  TDirectory::TContext caller_directory;
  for (const auto* src : {&signal, &background, &train_signal, &train_background})
    if (!src->file.empty())
      detail::check_scoring(m, src->file, output, "score");
  detail::GradientSums sums;
  const auto s = detail::score_source(m, signal, "test signal", &sums);
  const auto b = detail::score_source(m, background, "test background", &sums);
  detail::ScoredEvents ts, tb;
  if (train) {
    ts = detail::score_source(m, train_signal, "train signal");
    tb = detail::score_source(m, train_background, "train background");
  }
  Evaluation ev;
  detail::roc(s, b, ev.roc_signal_efficiency, ev.roc_background_rejection);
  for (size_t k = 1; k < ev.roc_signal_efficiency.size(); ++k) { // trapezoids over bkg eff
    const double x0 = 1 - ev.roc_background_rejection[k - 1],
                 x1 = 1 - ev.roc_background_rejection[k];
    ev.auc += (x1 - x0) * (ev.roc_signal_efficiency[k] + ev.roc_signal_efficiency[k - 1]) / 2;
  }
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const detail::ScoredEvents* e :
       std::initializer_list<const detail::ScoredEvents*>{&s, &b, &ts, &tb})
    for (double v : e->score)
      lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(hi > lo))
    hi = lo + 1.0;
  // the largest score inside the last bin (ROOT's upper edge belongs to the overflow)
  const double edge =
      hi + std::max(1e-9 * std::max(std::fabs(hi - lo), 1.0),
                    4 * (std::nextafter(hi, std::copysign(HUGE_VAL, hi)) - hi)); // np.spacing
  TDirectory::TContext none(nullptr);
  std::vector<std::pair<std::string, std::unique_ptr<TObject>>> owned; // written below
  auto keep = [&owned](const std::string& name, TObject* obj) {
    owned.emplace_back(name, std::unique_ptr<TObject>(obj));
  };
  const std::vector<std::pair<std::string, const detail::ScoredEvents*>> samples = {
      {"test_signal", &s},
      {"test_background", &b},
      {"train_signal", &ts},
      {"train_background", &tb}};
  std::vector<TH1D*> h;
  for (const auto& [name, e] : samples) {
    if (name.rfind("train", 0) == 0 && !train)
      break;
    const std::string split = name.substr(0, name.find('_')), cls = name.substr(name.find('_') + 1);
    h.push_back(detail::score_histogram("score_" + name, cls + " (" + split + ");score;events", *e,
                                        lo, edge, bins));
    keep("score_" + name, h.back());
  }
  if (train) {
    ev.ks_signal = h[2]->KolmogorovTest(h[0]);
    ev.ks_background = h[3]->KolmogorovTest(h[1]);
  }
  auto* graph = new TGraph((Int_t)ev.roc_signal_efficiency.size(), ev.roc_signal_efficiency.data(),
                           ev.roc_background_rejection.data());
  graph->SetTitle("ROC;signal efficiency;background rejection");
  keep("roc", graph);
  const double step = (hi - lo) / bins; // numpy.linspace's cuts, to the last bit
  for (int i = 0; i < bins; ++i)
    ev.cuts.push_back(i * step + lo);
  for (const auto& [cls, e] :
       {std::make_pair(std::string("signal"), &s), std::make_pair(std::string("background"), &b)}) {
    TH1D passed(("passed_" + cls).c_str(), "", bins, lo, edge);
    TH1D total(("total_" + cls).c_str(), "", bins, lo, edge);
    for (TH1D* t : {&passed, &total})
      t->SetDirectory(nullptr), t->Sumw2();
    double sum = 0, sum2 = 0;
    for (double w : e->w)
      sum += w, sum2 += w * w;
    auto& eff = cls == "signal" ? ev.signal_efficiency : ev.background_efficiency;
    for (int i = 0; i < bins; ++i) {
      double p = 0, p2 = 0;
      for (size_t k = 0; k < e->score.size(); ++k)
        if (e->score[k] >= ev.cuts[i])
          p += e->w[k], p2 += e->w[k] * e->w[k];
      passed.SetBinContent(i + 1, p), passed.SetBinError(i + 1, std::sqrt(p2));
      total.SetBinContent(i + 1, sum), total.SetBinError(i + 1, std::sqrt(sum2));
      eff.push_back(p / sum);
    }
    auto* te = new TEfficiency(passed, total);
    te->SetName(("efficiency_" + cls).c_str());
    te->SetTitle((cls + " efficiency;cut on the score (score >= cut passes);efficiency").c_str());
    te->SetDirectory(nullptr);
    keep("efficiency_" + cls, te);
  }
  { // the input-gradient ranking, by column (a column's values summed)
    data::TableSource in(signal.file, signal.tree, m.input_columns(), "", "");
    const std::vector<int> widths = in.widths();
    long j = 0;
    for (size_t c = 0; c < widths.size(); ++c) {
      double total = 0;
      for (int k = 0; k < widths[c]; ++k, ++j) {
        const double mean = sums.x[j] / sums.w;
        const double var = std::max(sums.x2[j] / sums.w - mean * mean, 0.0);
        total += sums.dx[j] / sums.w * std::sqrt(var);
      }
      ev.columns.push_back(m.input_columns()[c]);
      ev.gradient_importance.push_back(total);
    }
    auto* rank = new TH1D("importance_input", "variable ranking: input gradient;;importance",
                          (int)ev.columns.size(), 0, (double)ev.columns.size());
    rank->SetDirectory(nullptr);
    for (size_t c = 0; c < ev.columns.size(); ++c) {
      rank->SetBinContent((int)c + 1, ev.gradient_importance[c]);
      rank->GetXaxis()->SetBinLabel((int)c + 1, ev.columns[c].c_str());
    }
    keep("importance_input", rank);
  }
  std::ostringstream json;
  json.precision(17);
  json << "{\"model\": " << detail::json_quoted(m.stem()) << ", \"auc\": " << ev.auc
       << ", \"ks\": {";
  if (train)
    json << "\"signal\": " << ev.ks_signal << ", \"background\": " << ev.ks_background;
  json << "}, \"importance\": {\"input gradient\": {";
  for (size_t c = 0; c < ev.columns.size(); ++c)
    json << (c ? ", " : "") << detail::json_quoted(ev.columns[c]) << ": "
         << ev.gradient_importance[c];
  json << "}}}";
  keep("rootclad_evaluation", new TObjString(json.str().c_str()));
  write_root_file(output, [&](TFile& f) {
    for (const auto& [name, obj] : owned)
      f.WriteObjectAny(obj.get(), obj->IsA(), name.c_str());
  });
  return ev;
}

} // namespace rootclad

#endif // ROOTCLAD_EVALUATE_H
