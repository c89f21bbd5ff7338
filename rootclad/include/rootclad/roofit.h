// rootclad/roofit.h — an exported rootclad model as RooFit functions whose gradient is the
// compiled backward's, so that RooMinimizer (Minuit2) fits with exact derivatives.
//
//   rootclad::RooModelFunction nn("nn", "network", "build/lr", RooArgList(x, mu));
//       its value: the model's one output for the list's values (in the model's input order);
//       hasGradient(): Minuit2 takes d value / d each parameter from the backward.
//   rootclad::RooModelSum nll("nll", "-sum log r", nn, data, -1.0);
//       scale * sum over the rows of `data` (weighted) of the model's output, the inputs that
//       are columns of `data` read from each row, the others being the fit's parameters: a
//       neural negative log-likelihood (ratio) with its exact gradient, in one batched
//       forward and backward per call.
//
// Both carry the export itself (its library and weights, as bytes): written into a
// RooWorkspace or a ROOT file and read back in another process, on another machine, they need
// neither the export's files nor any path; the bytes are written once into the private cache
// ($ROOTCLAD_CACHE_DIR/exports, named by their MD5) and loaded from there. The library is
// code: one read from a file runs only when this account has run it before (its copy is in
// the private cache) or after RooModelExport::trust(its MD5), which the refusal names. One
// function's model serves its clones too: a function is not for evaluation from several
// threads at once (RooFit evaluates on one). They need a dictionary: compile this header with
// ACLiC (python -m rootclad.root.roofit builds it once and prints the library to
// gSystem->Load in a macro; rootclad.root.roofit.load() in Python).
#ifndef ROOTCLAD_ROOFIT_H
#define ROOTCLAD_ROOFIT_H

#include <RooAbsData.h>
#include <RooAbsReal.h>
#include <RooArgList.h>
#include <RooArgSet.h>
#include <RooListProxy.h>
#include <RooRealVar.h>
#include <TMD5.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "model.h"

namespace rootclad {

namespace detail {

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("rootclad: cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::string md5_of(const std::string& bytes) {
  TMD5 md5;
  md5.Update(reinterpret_cast<const UChar_t*>(bytes.data()), (UInt_t)bytes.size());
  md5.Final();
  return md5.AsString();
}

// `bytes` as the file dir/name: kept when it is there with these bytes, else written to a
// temporary name and renamed (dir is private: library_dir() made and checked it)
inline void write_private(const std::string& dir, const std::string& name,
                          const std::string& bytes) {
  const std::string path = dir + "/" + name;
  {
    std::ifstream in(path, std::ios::binary);
    if (in && file_bytes(path) == bytes)
      return;
  }
  const std::string tmp =
      dir + "/.roofit." + std::to_string(::getpid()) + "." + std::to_string(next_write());
  std::FILE* out = std::fopen(tmp.c_str(), "wbxe");
  if (!out)
    throw std::runtime_error("rootclad: cannot write in " + dir);
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), out) == bytes.size();
  if (std::fclose(out) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("rootclad: cannot write " + path);
  }
}

// The parameters of `f` in the order RooMinimizer lays out a gradient: all of them, constant
// ones too (RooMinimizerFcn asks gradient() for one value per parameter of
// getParameters(nullptr, set, /*stripDisconnected*/ false), sorted by name, and picks the
// floating ones from it)
inline RooArgSet gradient_parameters(const RooAbsArg& f) {
  RooArgSet params;
  f.getParameters(nullptr, params, false);
  return params;
}

} // namespace detail

// The model of an export, carried as bytes and loaded from the private cache on first use.
// Its library is code: one read from a file or workspace runs only if this account has run
// the same export before (its copy is in the private cache, which only this account writes)
// or after RooModelExport::trust(its MD5); one made from an export's files is trusted.
class RooModelExport {
public:
  RooModelExport() = default;
  explicit RooModelExport(const std::string& stem)
      : stem_(detail::resolved(stem)), library_(detail::file_bytes(stem_ + ".so")),
        weights_(detail::file_bytes(stem_ + ".root")), trusted_(true) {}
  RooModelExport(const RooModelExport& other)
      : stem_(other.stem_), library_(other.library_), weights_(other.weights_),
        model_(other.model_), trusted_(other.trusted_) {}
  RooModelExport& operator=(const RooModelExport&) = delete;
  virtual ~RooModelExport() = default;

  // Allow the export whose library and weights have this MD5 (md5()) to run in this process:
  // added to $ROOTCLAD_TRUSTED_EXPORTS (MD5s separated by ':'), which may also be set before
  // the process starts. (The environment, not a static: Cling and the library each have their
  // own copy of a header's statics.)
  static void trust(const std::string& md5) {
    const char* now = std::getenv("ROOTCLAD_TRUSTED_EXPORTS");
    const std::string list = now && *now ? std::string(now) + ":" + md5 : md5;
    ::setenv("ROOTCLAD_TRUSTED_EXPORTS", list.c_str(), 1);
  }
  std::string md5() const { return detail::md5_of(library_ + weights_); }

  Model& model() const {
    if (!model_) {
      const std::string dir = detail::library_dir(), hash = md5(), key = "roofit-" + hash;
      if (!trusted_ && !known(dir + "/" + key) && !trusted_by_user(hash))
        throw std::runtime_error(
            "rootclad: a RooFit function read from a file carries the compiled library of the "
            "export " +
            stem_ + " (MD5 " + hash +
            "), which this account has not run: it is "
            "code. If you trust its author, call rootclad::RooModelExport::trust(\"" +
            hash + "\") (Python: rootclad.root.roofit.trust(\"" + hash + "\")) first");
      detail::write_private(dir, key + ".so", library_);
      detail::write_private(dir, key + ".root", weights_);
      model_ = std::make_shared<Model>(dir + "/" + key);
    }
    return *model_;
  }
  // where it was exported from (for messages: the function works without it)
  const std::string& stem() const { return stem_; }
  void set_origin(const std::string& origin) { stem_ = origin; }

private:
  bool known(const std::string& stem) const {
    std::ifstream lib(stem + ".so", std::ios::binary), weights(stem + ".root", std::ios::binary);
    return lib && weights && detail::file_bytes(stem + ".so") == library_ &&
           detail::file_bytes(stem + ".root") == weights_;
  }
  static bool trusted_by_user(const std::string& md5) {
    const char* list = std::getenv("ROOTCLAD_TRUSTED_EXPORTS");
    std::stringstream in(list ? list : "");
    for (std::string item; std::getline(in, item, ':');)
      if (item == md5)
        return true;
    return false;
  }

  std::string stem_, library_, weights_;
  mutable std::shared_ptr<Model> model_; //! loaded on first use
  bool trusted_ = false;                 //! made here from the export's files
  ClassDef(RooModelExport, 1)
};

class RooModelFunction : public RooAbsReal {
public:
  RooModelFunction() = default;
  // `stem`: the export (STEM.so, STEM.root), read now; `inputs`: one RooAbsReal per model input
  // `origin`: how messages name the export (default: its stem)
  RooModelFunction(const char* name, const char* title, const char* stem, const RooArgList& inputs,
                   const char* origin = nullptr)
      : RooAbsReal(name, title), inputs_("inputs", "the model's inputs", this),
        export_(stem ? stem : "") {
    if (origin)
      export_.set_origin(origin);
    inputs_.add(inputs);
    check();
  }
  RooModelFunction(const RooModelFunction& other, const char* name = nullptr)
      : RooAbsReal(other, name), inputs_("inputs", this, other.inputs_), export_(other.export_) {}
  TObject* clone(const char* newname) const override {
    return new RooModelFunction(*this, newname);
  }

  // Minuit2 asks for gradient() when every input is a variable (a RooRealVar: a RooLinearVar
  // is an lvalue whose parameters are not the inputs)
  bool hasGradient() const override {
    for (const RooAbsArg* a : inputs_)
      if (!dynamic_cast<const RooRealVar*>(a))
        return false;
    return true;
  }
  // d value / d each parameter (constant ones too), in RooMinimizer's layout
  void gradient(double* out) const override {
    const std::vector<double> dx = input_gradient();
    const RooArgSet params = detail::gradient_parameters(*this);
    for (std::size_t k = 0; k < params.size(); ++k) {
      out[k] = 0;
      for (int i = 0; i < inputs_.getSize(); ++i)
        if (inputs_.at(i) == params[k])
          out[k] += dx[i];
    }
  }
  // d value / d each input, in the list's order (the compiled backward, one sample)
  std::vector<double> input_gradient() const {
    std::vector<double> x = values(), dx(x.size());
    export_.model().input_grad(x.data(), dx.data(), 1);
    return dx;
  }
  const RooArgList& inputs() const { return inputs_; }
  const RooModelExport& model_export() const { return export_; }

protected:
  double evaluate() const override {
    std::vector<double> x = values();
    double out = 0;
    export_.model().predict(x.data(), &out, 1);
    return out;
  }

private:
  std::vector<double> values() const {
    std::vector<double> x(inputs_.getSize());
    for (int i = 0; i < inputs_.getSize(); ++i)
      x[i] = static_cast<const RooAbsReal&>(inputs_[i]).getVal();
    return x;
  }
  // one output, and one RooAbsReal per input: else the error names the function, the export
  // and the inputs on both sides
  void check() const {
    Model& m = export_.model();
    std::string given;
    for (const RooAbsArg* a : inputs_)
      given += std::string(given.empty() ? "" : ", ") + a->GetName();
    const std::string what =
        std::string("rootclad: RooModelFunction '") + GetName() + "' of " + export_.stem();
    if (m.output_size() != 1)
      throw std::invalid_argument(what + ": the model has " + std::to_string(m.output_size()) +
                                  " outputs per event; a RooFit function takes one");
    for (const RooAbsArg* a : inputs_)
      if (!dynamic_cast<const RooAbsReal*>(a))
        throw std::invalid_argument(what + ": input '" + a->GetName() +
                                    "' is not a real-valued RooFit object");
    if (inputs_.getSize() != m.input_size()) {
      std::string names;
      for (const auto& c : m.input_columns())
        names += std::string(names.empty() ? "" : ", ") + c;
      throw std::invalid_argument(what + ": the model takes " + std::to_string(m.input_size()) +
                                  " inputs" + (names.empty() ? "" : " (" + names + ")") +
                                  ", the list holds " + std::to_string(inputs_.getSize()) + " (" +
                                  given + ")");
    }
  }

  RooListProxy inputs_;
  RooModelExport export_;
  ClassDefOverride(RooModelFunction, 1)
};

class RooModelSum : public RooAbsReal {
public:
  RooModelSum() = default;
  // scale * sum over the rows of `data` of w_row * f(row): the inputs of `f` that are columns
  // of `data` come from the row, the others (its parameters) from their current values
  RooModelSum(const char* name, const char* title, const RooModelFunction& f,
              const RooAbsData& data, double scale = 1.0)
      : RooAbsReal(name, title), params_("params", "the fit's parameters", this),
        export_(f.model_export()), scale_(scale) {
    const RooArgSet* row = data.get();
    const RooArgList& in = f.inputs();
    n_inputs_ = in.getSize();
    std::string columns;
    for (int i = 0; i < n_inputs_; ++i) {
      if (row && row->find(in[i].GetName())) {
        columns_.push_back(i);
        columns += std::string(columns.empty() ? "" : ", ") + in[i].GetName();
      } else {
        slots_.push_back(i);
        params_.add(in[i]);
      }
    }
    if (columns_.empty())
      throw std::invalid_argument(std::string("rootclad: RooModelSum '") + name + "': dataset '" +
                                  data.GetName() + "' has no column named as an input of '" +
                                  f.GetName() + "'");
    const long n = data.numEntries();
    rows_.resize(n * n_inputs_);
    weights_.resize(n);
    for (long e = 0; e < n; ++e) {
      const RooArgSet* r = data.get(e);
      for (int i : columns_) {
        const auto* v = dynamic_cast<const RooAbsReal*>(r->find(in[i].GetName()));
        if (!v)
          throw std::invalid_argument(std::string("rootclad: RooModelSum '") + name +
                                      "': column '" + in[i].GetName() + "' of dataset '" +
                                      data.GetName() + "' is not real-valued");
        rows_[e * n_inputs_ + i] = v->getVal();
      }
      weights_[e] = data.weight();
    }
  }
  RooModelSum(const RooModelSum& other, const char* name = nullptr)
      : RooAbsReal(other, name), params_("params", this, other.params_), export_(other.export_),
        scale_(other.scale_), n_inputs_(other.n_inputs_), columns_(other.columns_),
        slots_(other.slots_), rows_(other.rows_), weights_(other.weights_) {}
  TObject* clone(const char* newname) const override { return new RooModelSum(*this, newname); }

  bool hasGradient() const override {
    for (const RooAbsArg* a : params_)
      if (!dynamic_cast<const RooRealVar*>(a))
        return false;
    return true;
  }
  void gradient(double* out) const override {
    ++gradient_calls_;
    const long n = (long)weights_.size();
    std::vector<double> x = filled(), dx(x.size());
    export_.model().input_grad(x.data(), dx.data(), (int)n);
    const RooArgSet params = detail::gradient_parameters(*this);
    for (std::size_t k = 0; k < params.size(); ++k) {
      double sum = 0;
      for (size_t p = 0; p < slots_.size(); ++p)
        if (params_.at(p) == params[k])
          for (long e = 0; e < n; ++e)
            sum += weights_[e] * dx[e * n_inputs_ + slots_[p]];
      out[k] = scale_ * sum;
    }
  }
  long rows() const { return (long)weights_.size(); }
  long gradient_calls() const { return gradient_calls_; } // in this process

protected:
  double evaluate() const override {
    const long n = (long)weights_.size();
    std::vector<double> x = filled(), out(n);
    export_.model().predict(x.data(), out.data(), (int)n);
    double sum = 0;
    for (long e = 0; e < n; ++e)
      sum += weights_[e] * out[e];
    return scale_ * sum;
  }

private:
  std::vector<double> filled() const {
    std::vector<double> x(rows_);
    const long n = (long)weights_.size();
    for (size_t p = 0; p < slots_.size(); ++p) {
      const double v = static_cast<const RooAbsReal&>(params_[p]).getVal();
      for (long e = 0; e < n; ++e)
        x[e * n_inputs_ + slots_[p]] = v;
    }
    return x;
  }

  RooListProxy params_;
  RooModelExport export_;
  double scale_ = 1.0;
  int n_inputs_ = 0;
  std::vector<int> columns_, slots_; // the inputs read from the data, and the parameters'
  std::vector<double> rows_, weights_;
  mutable long gradient_calls_ = 0; //!
  ClassDefOverride(RooModelSum, 1)
};

} // namespace rootclad

#endif // ROOTCLAD_ROOFIT_H
