// rootclad/model.h — an exported rootclad model in C++ (macros, programs, PyROOT; no torch).
//
// cm.export("build/gwnet") (Python) or `rootclad build ... -o build/gwnet` writes
//   build/gwnet.so    the compiled model (forward, Clad or pullback backward, optimizers)
//   build/gwnet.root  its parameters, one TTree per tensor (branch "values", one entry), and
//                     "rootclad_metadata" (JSON: prefix, shapes, MD5, the input columns...)
//   build/gwnet.h     this header and those it includes, in one file
//
//   rootclad::Model m("build/gwnet");          // library + weights, checked against each other
//   rootclad::Adam opt(m, 1e-3);
//   double loss = m.train_step(x.data(), y.data(), B, opt);
//   m.predict(x.data(), out.data(), B);  m.input_grad(x.data(), dx.data(), B);
//   m.save("trained.root");
//
// Inputs and outputs may be float or double whatever the model's dtype (converted on the way
// in and out). A Model owns its parameters and one workspace sized for the largest batch it
// has run (grown on demand, never per call); one Model is not for concurrent calls: use one
// per thread (rootclad::SlotModels does that for RDataFrame's processing slots).
// A fingerprint of these headers (export.py: headers_id): an exported STEM.h of another
// version and these in one program would share include guards; they stop here instead.
#if defined(ROOTCLAD_MODEL_H) && ROOTCLAD_HEADERS_ID + 0 != 0x796c23a
#error "rootclad: STEM.h of another rootclad version: include only one, or export again"
#endif
#ifndef ROOTCLAD_MODEL_H
#define ROOTCLAD_MODEL_H
#define ROOTCLAD_HEADERS_ID 0x796c23a

#include <TDirectory.h>
#include <TFile.h>
#include <TLeaf.h>
#include <TMD5.h>
#include <TObjString.h>
#include <TTree.h>

#include <ROOT/RVec.hxx>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dropout_mask.h" // call_seed
#include "model_api.h"    // sibling-relative: macros include this header by path
#include "optim.h"
#include "parallel.h" // default_num_threads: the thread count of the model library's pool
#include "uncaught.h" // an uncaught exception in `root -b -q` reported, not an abort

#include "model_file.h"
#include "optimizers.h"

namespace rootclad {

class Model {
public:
  // Opens STEM.so and STEM.root (a relative STEM resolved against the working directory); the
  // library runs from a private copy named by its MD5 ($ROOTCLAD_CACHE_DIR/exports), so an
  // export replaced later is another library. Throws std::runtime_error naming the file when
  // either is missing, the library is not the one the weights were exported with, or a
  // tensor's shape differs.
  explicit Model(const std::string& stem) : stem_(detail::resolved(stem)) {
    ::rootclad::detail::report_uncaught_in_root_sessions();
    const std::string lib = stem_ + ".so", weights = stem_ + ".root";
    std::unique_ptr<TFile> f(TFile::Open(weights.c_str(), "READ"));
    if (!f || f->IsZombie())
      throw std::runtime_error("rootclad: cannot open " + weights +
                               " (the weights of an exported model: cm.export(stem))");
    auto* meta = f->Get<TObjString>("rootclad_metadata");
    if (!meta)
      throw std::runtime_error("rootclad: " + weights +
                               " holds no rootclad_metadata (not written by cm.export?)");
    const std::string json = meta->GetString().Data();
    const std::string prefix = detail::json_field(json, "prefix");
    if (!std::ifstream(lib).good())
      throw std::runtime_error("rootclad: " + lib + " is missing (export the model again)");
    // from a private copy named by its hash, checked as it was written (model_file.h)
    api_ =
        detail::open_export_library(lib, detail::json_field(json, "library_md5"), weights, prefix);
    const std::string seed = detail::json_field(json, "seed"); // absent before it was exported
    seed_ = seed.empty() ? 0 : std::stoull(seed);
    schema_ = detail::read_schema(json);
    const auto frozen = detail::json_array(json, "frozen");
    for (const auto& info : api_.params) // a frozen tensor takes no optimizer step (step 0)
      if (std::find(frozen.begin(), frozen.end(), info.name) != frozen.end())
        frozen_.push_back(&info - api_.params.data());
    if (api_.is_double())
      pd_.assign(api_.n_params, 0.0);
    else
      pf_.assign(api_.n_params, 0.0f);
    set_parameters(read_params(*f, weights));
  }

  const ModelApi& api() const { return api_; }
  const std::string& stem() const { return stem_; }
  long n_params() const { return api_.n_params; }
  long input_size() const { return api_.input_size; }
  long output_size() const { return api_.output_size; }
  const std::string& dtype() const { return api_.dtype; }
  const std::string& engine() const { return api_.engine; }
  const std::string& loss() const { return api_.loss; }

  // The export's schema (cm.export(stem, schema=...)): input columns in order, values per
  // event; target and weight columns; class names. Empty for an export without one.
  const std::vector<std::string>& input_columns() const { return schema_.columns; }
  const std::vector<long>& input_lengths() const { return schema_.lengths; }
  const std::string& target_column() const { return schema_.target; }
  const std::string& weight_column() const { return schema_.weight; }
  const std::vector<std::string>& class_names() const { return schema_.classes; }

  // The batch whose activations fill about `bytes` per thread of the library's pool (a
  // forward pass reads each layer's input from cache; the pool gives each thread a share of
  // the batch), within [8, 256] per thread: the GW CNN (350 KB a sample) 12 a thread, the MLP
  // 256. Measured on the CNN, one thread: 126 us an event at batch 16, 176 at 256.
  int cache_batch(long bytes = 4L << 20) const {
    const long per = api_.act_size(1) * api_.element_size();
    const long b = per > 0 ? bytes / per : 256;
    return (int)(b < 8 ? 8 : (b > 256 ? 256 : b)) * default_num_threads();
  }

  // out (B, output_size) = the model on x (B, input_size), in eval mode.
  void predict(const float* x, float* out, int B) { predict_as(x, out, B); }
  void predict(const double* x, double* out, int B) { predict_as(x, out, B); }
  // dx (B, input_size) = d(sum of the outputs) / dx: the saliency of a one-output model.
  void input_grad(const float* x, float* dx, int B) { input_grad_as(x, dx, B); }
  void input_grad(const double* x, double* dx, int B) { input_grad_as(x, dx, B); }
  // The mean loss of a batch in eval mode (y: B * output_size targets, cross_entropy/nll: B class
  // indices): a validation loss. w: per-sample weights or null, normalised as train_step's (the
  // weighted loss is the library's loss_and_grad in eval mode, its gradient left in gradients()).
  double loss(const float* x, const float* y, int B, const float* w = nullptr) {
    return loss_as(x, y, B, w);
  }
  double loss(const double* x, const double* y, int B, const double* w = nullptr) {
    return loss_as(x, y, B, w);
  }
  // The mean loss of a batch in training mode; the gradient of every parameter is left in
  // gradients(). w: per-sample weights (B values; HEP event weights) or null: the loss is then
  // the mean over elements of w[b] * loss_element (kernels.h: weighted_loss).
  double loss_and_grad(const float* x, const float* y, int B, const float* w = nullptr) {
    return lag_as(x, y, B, w);
  }
  double loss_and_grad(const double* x, const double* y, int B, const double* w = nullptr) {
    return lag_as(x, y, B, w);
  }
  // How per-sample weights normalise the loss: "mean" (the default: the mean over elements of
  // w[b] * loss_element) or "sum_w" (sum_b w[b] * loss_b / sum_b w[b], as HEP fits normalise:
  // the weights scaled by B / sum(w) first; torch: (l * w).sum() / w.sum() over samples).
  void set_weight_norm(const std::string& norm) {
    if (norm != "mean" && norm != "sum_w")
      throw std::invalid_argument("rootclad: weight_norm '" + norm +
                                  "'; expected \"mean\" or \"sum_w\"");
    sum_w_ = norm == "sum_w";
  }
  std::string weight_norm() const { return sum_w_ ? "sum_w" : "mean"; }
  // Forward, backward and opt's update in one library call (training mode); the loss.
  double train_step(const float* x, const float* y, int B, Optimizer& o, const float* w = nullptr) {
    return step_as(x, y, B, o, w);
  }
  double train_step(const double* x, const double* y, int B, Optimizer& o,
                    const double* w = nullptr) {
    return step_as(x, y, B, o, w);
  }

  // One event (RDataFrame): the first output, and d(first output)/d(input).
  double score(const ROOT::RVec<float>& x) { return score_as(x.data(), (long)x.size()); }
  double score(const ROOT::RVec<double>& x) { return score_as(x.data(), (long)x.size()); }
  ROOT::RVec<float> saliency(const ROOT::RVec<float>& x) { return saliency_as(x); }
  ROOT::RVec<double> saliency(const ROOT::RVec<double>& x) { return saliency_as(x); }

  // The flat parameter block (a copy) and its gradient after loss_and_grad, as doubles.
  std::vector<double> parameters() const { return as_doubles(pd_, pf_); }
  std::vector<double> gradients() const { return as_doubles(gd_, gf_); }
  void set_parameters(const std::vector<double>& p) {
    if ((long)p.size() != api_.n_params)
      throw std::invalid_argument("rootclad: set_parameters: " + std::to_string(p.size()) +
                                  " values for " + std::to_string(api_.n_params) + " parameters");
    for (long i = 0; i < api_.n_params; ++i)
      api_.is_double() ? void(pd_[i] = p[i]) : void(pf_[i] = (float)p[i]);
  }

  // Parameters to a ROOT file in the layout cm.export writes (one TTree per tensor), and with
  // `opt` its hyperparameters, step count and state (TTree "rootclad_optimizer": config[9],
  // step, state[2 * n_params]), so that training resumes where it stopped; written whole or
  // not at all (write_root_file). load() reads such a file (shapes and types checked, float32
  // values widened), and the optimizer state into `opt` when given; a file it refuses changes
  // neither the model nor `opt`.
  void save(const std::string& path, const Optimizer* opt = nullptr) const {
    // read before the file is written: `path` may be this model's own weights file
    std::unique_ptr<TFile> src(TFile::Open((stem_ + ".root").c_str(), "READ"));
    auto* meta = src && !src->IsZombie() ? src->Get<TObjString>("rootclad_metadata") : nullptr;
    const auto p = parameters();
    write_root_file(path, [&](TFile& f) {
      for (const auto& info : api_.params) {
        TTree t(info.name.c_str(),
                ("rootclad parameter, shape " + detail::shape_str(info.shape)).c_str());
        std::vector<double> values(p.begin() + info.offset, p.begin() + info.offset + info.numel);
        t.Branch("values", values.data(), ("values[" + std::to_string(info.numel) + "]/D").c_str());
        t.Fill();
        t.Write();
      }
      if (opt)
        write_optimizer(*opt);
      if (meta)
        f.WriteObject(meta, "rootclad_metadata");
    });
  }
  void load(const std::string& path, Optimizer* opt = nullptr) {
    std::unique_ptr<TFile> f(TFile::Open(path.c_str(), "READ"));
    if (!f || f->IsZombie())
      throw std::runtime_error("rootclad: cannot open " + path);
    const std::vector<double> p = read_params(*f, path);
    Optimizer state; // all of the file is read and checked before the model or opt changes
    if (opt) {
      state = *opt;
      read_optimizer(*f, path, state);
    }
    set_parameters(p);
    if (opt)
      *opt = state;
  }

private:
  std::string stem_;
  ModelApi api_;
  std::vector<double> pd_, gd_, wd_; // parameters, gradients, workspace (act | d_act)
  std::vector<float> pf_, gf_, wf_;
  std::vector<double> auxd_[2]; // targets and weights in the model's type
  std::vector<float> auxf_[2];
  int work_batch_ = 0;
  bool sum_w_ = false;                 // weight_norm "sum_w"
  detail::Schema schema_;              // the export's input columns, target, weight, classes
  std::vector<long> frozen_, steps_;   // frozen tensors' indices; per-tensor steps of a call
  std::uint64_t seed_ = 0, calls_ = 0; // the exported model's seed; calls made so far

  static constexpr int N_CONFIG = sizeof(OptimConfig) / sizeof(double);

  void write_optimizer(const Optimizer& o) const { // into the current directory
    TTree t("rootclad_optimizer", "rootclad optimizer: hyperparameters, step, state");
    double config[N_CONFIG];
    std::memcpy(config, &o.config, sizeof config);
    Long64_t step = o.step;
    std::vector<double> state(2 * api_.n_params, 0.0);
    const auto& d = o.state_d;
    const auto& f = o.state_f;
    for (size_t i = 0; i < state.size(); ++i)
      state[i] = !d.empty() ? d[i] : (!f.empty() ? (double)f[i] : 0.0);
    t.Branch("config", config, ("config[" + std::to_string(N_CONFIG) + "]/D").c_str());
    t.Branch("step", &step, "step/L");
    t.Branch("state", state.data(), ("state[" + std::to_string(state.size()) + "]/D").c_str());
    t.Fill();
    t.Write();
  }

  void read_optimizer(TFile& f, const std::string& path, Optimizer& o) {
    auto* t = f.Get<TTree>("rootclad_optimizer");
    if (!t)
      throw std::runtime_error("rootclad: " + path +
                               " holds no optimizer state (save it with "
                               "save(path, &opt))");
    auto* leaf = t->GetLeaf("state");
    if (!leaf || leaf->GetLen() != 2 * api_.n_params)
      throw std::runtime_error("rootclad: " + path + ": the optimizer state is for a model of " +
                               std::to_string(leaf ? leaf->GetLen() / 2 : 0) +
                               " parameters, this one has " + std::to_string(api_.n_params));
    double config[N_CONFIG];
    Long64_t step = 0;
    std::vector<double> state(2 * api_.n_params);
    const std::string what = path + ": the optimizer's ";
    if (auto* c = t->GetLeaf("config"); !c || c->GetLen() != N_CONFIG)
      throw std::runtime_error("rootclad: " + what + "config does not hold " +
                               std::to_string(N_CONFIG) + " values");
    detail::read_doubles(*t, "config", config, what + "config");
    detail::read_doubles(*t, "state", state.data(), what + "state");
    auto* s = t->GetLeaf("step");
    if (!s || std::string(s->GetTypeName()) != "Long64_t" ||
        t->SetBranchAddress("step", &step) < 0 || t->GetBranch("step")->GetEntry(0) <= 0)
      throw std::runtime_error("rootclad: cannot read " + what + "step (a Long64_t)");
    t->ResetBranchAddresses();
    // one NaN here would turn every parameter into NaN at the next step
    auto check_finite = [&](const char* field, const double* v, long n) {
      const long i = std::find_if(v, v + n, [](double x) { return !std::isfinite(x); }) - v;
      if (i < n)
        throw std::runtime_error("rootclad: " + what + field + " holds a non-finite value (" +
                                 std::to_string(v[i]) + ") at index " + std::to_string(i));
    };
    check_finite("config", config, N_CONFIG);
    check_finite("state", state.data(), (long)state.size());
    if (step < 0)
      throw std::runtime_error("rootclad: " + what + "step is negative (" + std::to_string(step) +
                               ")");
    if ((int)config[0] != (int)o.config.kind)
      throw std::runtime_error("rootclad: " + path +
                               " holds the state of another kind of "
                               "optimizer");
    OptimConfig loaded;
    std::memcpy(&loaded, config, sizeof config);
    try {
      Optimizer::check_config(loaded);
    } catch (const std::invalid_argument& e) {
      std::string why = e.what();
      if (why.rfind("rootclad: ", 0) == 0)
        why = why.substr(10);
      throw std::runtime_error("rootclad: " + what + "config: " + why);
    }
    std::memcpy(&o.config, config, sizeof config);
    o.step = (long)step;
    if (api_.is_double())
      o.state_d = state;
    else
      o.state_f.assign(state.begin(), state.end());
  }

  static std::vector<double> as_doubles(const std::vector<double>& d, const std::vector<float>& f) {
    return d.empty() ? std::vector<double>(f.begin(), f.end()) : d;
  }

  std::vector<double> read_params(TFile& f, const std::string& path) const {
    std::vector<double> p(api_.n_params);
    for (const auto& info : api_.params) {
      auto* t = f.Get<TTree>(info.name.c_str());
      if (!t)
        throw std::runtime_error("rootclad: " + path + " has no tensor '" + info.name + "'");
      auto* leaf = t->GetLeaf("values");
      if (!leaf || leaf->GetLen() != info.numel || t->GetEntries() != 1)
        throw std::runtime_error("rootclad: " + path + ": tensor '" + info.name + "' has " +
                                 std::to_string(leaf ? leaf->GetLen() : 0) +
                                 " values, the model expects " + std::to_string(info.numel) +
                                 " (shape " + detail::shape_str(info.shape) + ")");
      detail::read_doubles(*t, "values", p.data() + info.offset,
                           path + ": tensor '" + info.name + "'");
    }
    return p;
  }

  template <typename T> T* params() { return api_.is_double() ? (T*)pd_.data() : (T*)pf_.data(); }
  template <typename T> std::vector<T>& grads() {
    if constexpr (sizeof(T) == 8)
      return gd_;
    else
      return gf_;
  }
  template <typename T> std::vector<T>& work() {
    if constexpr (sizeof(T) == 8)
      return wd_;
    else
      return wf_;
  }

  // act and d_act for batch B (grown, never shrunk), the input copied (converted) in.
  template <typename T, typename In> T* stage(const In* x, int B) {
    if (B < 1)
      throw std::invalid_argument("rootclad: batch size must be at least 1");
    auto& w = work<T>();
    const long n = api_.act_size(B) + api_.d_act_size(B);
    if (B > work_batch_ || (long)w.size() < n) {
      try {
        w.assign(n, T(0));
      } catch (const std::bad_alloc&) {
        throw std::length_error("rootclad: a batch of " + std::to_string(B) + " needs " +
                                std::to_string(n * (long)sizeof(T) >> 20) +
                                " MiB of activations for " + stem_ + "; not available");
      }
      work_batch_ = B;
    }
    T* act = w.data();
    T* in = act + (long)B * api_.input_offset;
    for (long i = 0; i < (long)B * api_.input_size; ++i)
      in[i] = (T)x[i];
    return act;
  }

  std::uint64_t next_seed() { return call_seed(seed_, ++calls_); }

  // A null array would be read or written through (PyROOT passes ROOT.nullptr as it is); the
  // size of a bare pointer cannot be known, Python checks its arrays (rootclad/root/rdf.py).
  static void not_null(const char* method, const char* arg, const void* p) {
    if (!p)
      throw std::invalid_argument(std::string("rootclad::Model::") + method + ": " + arg +
                                  " is null");
  }

  template <typename In> void predict_as(const In* x, In* out, int B) {
    not_null("predict", "x", x);
    not_null("predict", "out", out);
    api_.is_double() ? predict_t<double>(x, out, B) : predict_t<float>(x, out, B);
  }
  template <typename T, typename In> void predict_t(const In* x, In* out, int B) {
    T* act = stage<T>(x, B);
    api_.entry_points<T>().forward(params<T>(), act, B, 0, next_seed());
    const T* o = act + (long)B * api_.output_offset;
    for (long i = 0; i < (long)B * api_.output_size; ++i)
      out[i] = (In)o[i];
  }

  template <typename In> void input_grad_as(const In* x, In* dx, int B) {
    not_null("input_grad", "x", x);
    not_null("input_grad", "dx", dx);
    api_.is_double() ? input_grad_t<double>(x, dx, B) : input_grad_t<float>(x, dx, B);
  }
  template <typename T, typename In> void input_grad_t(const In* x, In* dx, int B) {
    T* act = stage<T>(x, B);
    const long n = api_.act_size(B);
    auto& g = grads<T>();
    g.assign(api_.n_params, T(0));
    const auto seed = next_seed();
    const auto& e = api_.entry_points<T>();
    e.forward(params<T>(), act, B, 0, seed);
    T* ones = converted<T>(aux<T>(0), (const T*)nullptr, (long)B * api_.output_size);
    e.vjp(params<T>(), act, g.data(), act + n, ones, B, 0, seed, 1);
    const T* d = act + n + (long)B * api_.input_offset;
    for (long i = 0; i < (long)B * api_.input_size; ++i)
      dx[i] = (In)d[i];
  }

  template <typename In> double lag_as(const In* x, const In* y, int B, const In* w) {
    not_null("loss_and_grad", "x", x);
    not_null("loss_and_grad", "y", y);
    return api_.is_double() ? lag_t<double>(x, y, B, w) : lag_t<float>(x, y, B, w);
  }
  template <typename T, typename In> double lag_t(const In* x, const In* y, int B, const In* w) {
    check_finite("loss_and_grad", x, y, w, B);
    T* act = stage<T>(x, B);
    const T* yt = converted<T>(aux<T>(0), y, targets(B));
    const T* wt = w ? event_weights<T>(w, B) : nullptr;
    auto& g = grads<T>();
    g.assign(api_.n_params, T(0));
    return api_.entry_points<T>().loss_and_grad(params<T>(), act, yt, g.data(),
                                                act + api_.act_size(B), B, 1, next_seed(), 0, wt);
  }
  // the per-sample weights as T, scaled by B / sum(w) under weight_norm "sum_w"
  template <typename T, typename In> const T* event_weights(const In* w, int B) {
    T* wt = converted<T>(aux<T>(1), w, B);
    if (!sum_w_)
      return wt;
    double total = 0;
    for (int b = 0; b < B; ++b)
      total += (double)wt[b];
    if (!(total > 0 || total < 0))
      throw std::invalid_argument("rootclad: weight_norm sum_w: the batch's weights sum to " +
                                  std::to_string(total) +
                                  "; the normalised loss needs a sum "
                                  "other than 0");
    for (int b = 0; b < B; ++b)
      wt[b] = (T)((double)wt[b] * B / total);
    return wt;
  }
  // targets, weights (or ones, from null) as T in a buffer of the model's, grown on demand
  template <typename T, typename In> static T* converted(std::vector<T>& buf, const In* v, long n) {
    if ((long)buf.size() < n)
      buf.resize(n);
    for (long i = 0; i < n; ++i)
      buf[i] = v ? (T)v[i] : T(1);
    return buf.data();
  }
  template <typename T> std::vector<T>& aux(int i) {
    if constexpr (sizeof(T) == 8)
      return auxd_[i];
    else
      return auxf_[i];
  }

  template <typename In> double loss_as(const In* x, const In* y, int B, const In* w) {
    not_null("loss", "x", x);
    not_null("loss", "y", y);
    return api_.is_double() ? loss_t<double>(x, y, B, w) : loss_t<float>(x, y, B, w);
  }
  template <typename T, typename In> double loss_t(const In* x, const In* y, int B, const In* w) {
    T* act = stage<T>(x, B);
    const T* yt = converted<T>(aux<T>(0), y, targets(B));
    const auto& e = api_.entry_points<T>();
    if (w) {
      const T* wt = event_weights<T>(w, B);
      auto& g = grads<T>();
      g.assign(api_.n_params, T(0));
      return e.loss_and_grad(params<T>(), act, yt, g.data(), act + api_.act_size(B), B, 0,
                             next_seed(), 0, wt);
    }
    e.forward(params<T>(), act, B, 0, next_seed());
    return e.loss_value(act, yt, B);
  }

  template <typename In>
  double step_as(const In* x, const In* y, int B, Optimizer& o, const In* w) {
    not_null("train_step", "x", x);
    not_null("train_step", "y", y);
    return api_.is_double() ? step_t<double>(x, y, B, o, o.state_d, w)
                            : step_t<float>(x, y, B, o, o.state_f, w);
  }
  template <typename T, typename In>
  double step_t(const In* x, const In* y, int B, Optimizer& o, std::vector<T>& state, const In* w) {
    if (state.empty())
      state.assign(2 * api_.n_params, T(0));
    if ((long)state.size() != 2 * api_.n_params)
      throw std::invalid_argument("rootclad: this optimizer was used with another model");
    check_finite("train_step", x, y, w, B);
    T* act = stage<T>(x, B);
    const T* yt = converted<T>(aux<T>(0), y, targets(B));
    const T* wt = w ? event_weights<T>(w, B) : nullptr;
    auto& g = grads<T>();
    if ((long)g.size() != api_.n_params)
      g.assign(api_.n_params, T(0));
    o.step += 1;
    const long* steps = nullptr; // every tensor at o.step, or frozen ones (exported so) at 0
    if (!frozen_.empty()) {
      steps_.assign(api_.params.size(), o.step);
      for (long i : frozen_)
        steps_[i] = 0;
      steps = steps_.data();
    }
    return api_.entry_points<T>().train_step(
        params<T>(), act, yt, g.data(), act + api_.act_size(B), state.data(),
        reinterpret_cast<const double*>(&o.config), o.step, B, next_seed(), steps, wt);
  }

  // Training refuses non-finite inputs, targets and weights before touching the parameters
  // (one NaN would turn every weight into NaN); predict and score propagate NaN, as torch does.
  template <typename In>
  void check_finite(const char* what, const In* x, const In* y, const In* w, int B) const {
    if (B < 1)
      throw std::invalid_argument("rootclad: batch size must be at least 1");
    auto first_bad = [](const In* v, long n) {
      for (long i = 0; i < n; ++i)
        if (!std::isfinite(v[i]))
          return i;
      return -1L;
    };
    const long per[3] = {api_.input_size, targets(B) / B, 1};
    const In* arrays[3] = {x, y, w};
    const char* names[3] = {"input", "target", "weight"};
    for (int a = 0; a < 3; ++a) {
      const long i = arrays[a] ? first_bad(arrays[a], (long)B * per[a]) : -1;
      if (i >= 0) {
        std::ostringstream os;
        os << "rootclad: " << what << ": non-finite " << names[a] << " (" << arrays[a][i]
           << ") in sample " << i / per[a] << ", value " << i % per[a] << "; " << stem_
           << " was not updated";
        throw std::invalid_argument(os.str());
      }
    }
  }

  long targets(int B) const { return api_.class_targets() ? (long)B : (long)B * api_.output_size; }

  void check_event(size_t n) const {
    if ((long)n != api_.input_size)
      throw std::invalid_argument("rootclad: an event of " + std::to_string(n) +
                                  " values; the model " + stem_ + " takes " +
                                  std::to_string(api_.input_size));
  }
  template <typename In> ROOT::RVec<In> saliency_as(const ROOT::RVec<In>& x) {
    check_event(x.size());
    if (api_.output_size != 1)
      throw std::invalid_argument("rootclad: saliency needs a model with one output per event; " +
                                  stem_ + " has " + std::to_string(api_.output_size));
    ROOT::RVec<In> dx(x.size());
    input_grad_as(x.data(), dx.data(), 1);
    return dx;
  }
  template <typename In> double score_as(const In* x, long n) {
    check_event(n);
    if (api_.output_size == 1) {
      In out{};
      predict_as(x, &out, 1);
      return out;
    }
    std::vector<In> out(api_.output_size);
    predict_as(x, out.data(), 1);
    return out[0];
  }
};

} // namespace rootclad

#include "scoring.h" // score_tree and SlotModels, which macros find through this header

#endif // ROOTCLAD_MODEL_H
