// rootclad/scoring.h — an exported model over a TTree or an RNTuple: score_tree writes one score
// per entry to a friend tree; SlotModels gives RDataFrame's processing slots one
// Model each, and shipped_model the tasks of a distributed RDataFrame one Model per thread.
#ifndef ROOTCLAD_SCORING_H
#define ROOTCLAD_SCORING_H

#include <TNamed.h>
#include <TSystem.h>

#include <pthread.h> // <sys/stat.h> is not included: model_file.h says why

#include <cctype>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "model.h"
#include "tree_reader.h" // score_tree reads its input as the training readers do

namespace rootclad {

namespace detail {
// A name ROOT reads as a plain name: letters, digits and _, not starting with a digit. A leaf
// list is parsed from the branch's name (TTree::Branch writes "<name>/F" even when the type is
// given as a float*): "s[64]" was read as 64 floats from the address of one, "x/D" as a
// double, "a:b:c" as three leaves.
inline bool is_identifier(const std::string& name) {
  if (name.empty() || std::isdigit((unsigned char)name[0]))
    return false;
  for (const char c : name)
    if (!std::isalnum((unsigned char)c) && c != '_')
      return false;
  return true;
}

// Refuses, before anything is written, a score column that is not an identifier and an output
// that is the input file or one of the model's files (the same path, a link to it, the same
// inode): writing it would replace what is being read.
inline void check_scoring(const Model& m, const std::string& file, const std::string& out_file,
                          const std::string& column) {
  if (!is_identifier(column))
    throw std::invalid_argument("rootclad::score_tree: column '" + column +
                                "' is not an identifier (letters, digits and _, not starting "
                                "with a digit): ROOT would read it as a leaf list");
  FileStat_t out;
  if (gSystem->GetPathInfo(out_file.c_str(), out) != 0)
    return; // nothing there yet: nothing to lose
  auto same = [&](const std::string& path) {
    FileStat_t st;
    return gSystem->GetPathInfo(path.c_str(), st) == 0 && st.fDev == out.fDev &&
           st.fIno == out.fIno;
  };
  if (same(file))
    throw std::invalid_argument("rootclad::score_tree: the output " + out_file + " is the input " +
                                file +
                                " (the same file): its trees would be replaced by the "
                                "scores; choose another output");
  for (const char* ext : {".so", ".root"})
    if (same(m.stem() + ext))
      throw std::invalid_argument("rootclad::score_tree: the output " + out_file +
                                  " is the model's own " + m.stem() + ext +
                                  "; choose another output");
}

// Scores `entries` rows, read by read(entry, x) into x (input_size floats), in batches, to the
// TTree `out_tree` of `out_file` (write_root_file: whole or not at all), with a TNamed
// "rootclad_scoring" titled `note` when one is given (what the scores were made from). (Not
// an RNTuple for an RNTuple input yet: RNTupleWriter::Append in a macro's text crashed
// root.exe when the macro ran again, ROOT 6.40.)
template <class Read>
long long score_rows(Model& m, long long entries, int batch, const std::string& out_file,
                     const std::string& out_tree, const std::string& column,
                     const std::string& note, Read read) {
  const long N = m.input_size(), K = m.output_size();
  batch = (int)std::min<long long>(batch, std::max<long long>(entries, 1)); // allocated below
  std::vector<float> xs((size_t)batch * N), out((size_t)batch * K);
  write_root_file(out_file, [&](TFile& f) {
    // owned by the output file, which deletes it on Close
    auto* scores = new TTree(out_tree.c_str(), ("rootclad scores of " + m.stem()).c_str());
    float value = 0;
    scores->Branch<float>(column.c_str(), &value); // the type from &value; column checked
    // after a failed write (a full disk) the rest is not scored: write_root_file says why
    for (long long start = 0; start < entries && !f.TestBit(TFile::kWriteError); start += batch) {
      const int n = (int)std::min<long long>(batch, entries - start);
      for (int i = 0; i < n; ++i)
        read(start + i, xs.data() + (size_t)i * N);
      m.predict(xs.data(), out.data(), n);
      for (int i = 0; i < n; ++i) {
        value = out[(size_t)i * K];
        scores->Fill();
      }
    }
    scores->Write();
    if (!note.empty())
      TNamed("rootclad_scoring", note.c_str()).Write();
  });
  return entries;
}
} // namespace detail

// Scores every entry of `tree` in `file` in batches of `batch` (0: m.cache_batch()) and writes
// them, entry by entry, to a TTree `out_tree` (one float branch `column`: the first output) in
// `out_file` (write_root_file: whole or not at all), to be used as a friend of the input tree.
// `input` names one branch holding the whole model input per entry: float[N], vector<float>
// or RVec<float>, read and checked as the training readers do (tree_reader.h); a branch of
// another type is refused by name. `column` must be an identifier, and `out_file` may not be
// `file` or the model's files (check_scoring). Returns the number of entries.
// The Model overload scores with a model already open (opening one reads its weights and
// checks its library: ~0.1 s for the 541k-parameter MLP, as long as scoring 3000 events).
inline long long score_tree(Model& m, const std::string& file, const std::string& tree,
                            const std::string& input, const std::string& out_file,
                            const std::string& out_tree = "scores",
                            const std::string& column = "score", int batch = 0,
                            const std::string& note = "") {
  detail::check_scoring(m, file, out_file, column);
  if (batch <= 0)
    batch = m.cache_batch();
  data::TreeSource in(file, tree, input);
  const long N = m.input_size();
  if (in.length() >= 0 && in.length() != N)
    in.fail(std::to_string(in.length()) + " values per entry, the model " + m.stem() + " takes " +
                std::to_string(N),
            true, input);
  return detail::score_rows(
      m, in.entries(), batch, out_file, out_tree, column, note,
      [&](long long entry, float* x) { in.read(entry, x, nullptr, (int)N, false); });
}

// The same for a list of columns, numbers and arrays of any numeric type concatenated in order
// (the readers' feature lists), read as the training TableReader reads them; each event's
// length is checked, and so are the columns against those the model was exported with
// (m.input_columns(), when it has them):
//   rootclad::score_tree(m, "test.root", "events", m.input_columns(), "test_scores.root");
inline long long score_tree(Model& m, const std::string& file, const std::string& tree,
                            const std::vector<std::string>& inputs, const std::string& out_file,
                            const std::string& out_tree = "scores",
                            const std::string& column = "score", int batch = 0,
                            const std::string& note = "") {
  detail::check_scoring(m, file, out_file, column);
  if (inputs.empty())
    throw std::invalid_argument("rootclad::score_tree: no input columns (the model " + m.stem() +
                                " stores none: name them)");
  if (!m.input_columns().empty() && inputs != m.input_columns()) {
    std::string stored;
    for (const auto& c : m.input_columns())
      stored += (stored.empty() ? "" : ", ") + c;
    throw std::invalid_argument("rootclad::score_tree: the model " + m.stem() +
                                " was exported reading the columns " + stored +
                                " (names and order): pass m.input_columns()");
  }
  if (batch <= 0)
    batch = m.cache_batch();
  data::TableSource in(file, tree, inputs, "", "");
  const std::vector<int> widths = in.widths();
  long N = 0;
  std::string detail;
  for (size_t i = 0; i < inputs.size(); ++i) {
    N += widths[i];
    detail += (i ? ", " : "") + inputs[i] + " (" + std::to_string(widths[i]) + ")";
  }
  if (N != m.input_size())
    in.fail("columns " + detail + " hold " + std::to_string(N) + " values per entry; the model " +
                m.stem() + " takes " + std::to_string(m.input_size()),
            true);
  return detail::score_rows(
      m, in.entries(), batch, out_file, out_tree, column, note,
      [&](long long entry, float* x) { in.read(entry, widths, x, nullptr, nullptr, false); });
}

inline long long score_tree(const std::string& file, const std::string& tree,
                            const std::string& input, const std::string& stem,
                            const std::string& out_file, const std::string& out_tree = "scores",
                            const std::string& column = "score", int batch = 0) {
  Model m(stem);
  return score_tree(m, file, tree, input, out_file, out_tree, column, batch);
}

// The entries of the TTree or RNTuple `tree` of `file`, opened as the readers open it (an
// error names the file and the tree).
inline long long entries_of(const std::string& file, const std::string& tree) {
  return data::TreeFile(file, tree).entries();
}

// A distributed RDataFrame's Define names its columns through this number (registered by
// register_shipped_names on each worker) rather than a global of the client's process.
struct ShippedNames {
  std::uint64_t id;
};

// One event's input for define_score / define_saliency from the RDataFrame's columns: a whole
// input column checked (checked_event), or several columns of numbers and arrays concatenated
// in order (event_input). An event of another length raises naming the entry (rdfentry_) and
// each column's length; `names` holds the columns' names, comma-separated (or a ShippedNames).
namespace detail {
template <class T> long column_length(const T& v) {
  if constexpr (std::is_arithmetic_v<T>)
    return 1;
  else
    return (long)v.size();
}
template <class T> void append_column(ROOT::RVecD& out, const T& v) {
  if constexpr (std::is_arithmetic_v<T>)
    out.push_back((double)v);
  else
    for (const auto& e : v)
      out.push_back((double)e);
}
inline std::string names_text(const char* names) {
  return names;
}
inline std::string names_text(ShippedNames names); // below
template <class Names>
void wrong_event(long expected, unsigned long long entry, const Names& given,
                 const std::vector<long>& lengths) {
  const std::string names = names_text(given);
  std::string cols;
  size_t at = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const size_t end = names.find(',', at);
    cols += (i ? ", " : "") + names.substr(at, end - at) + " (" + std::to_string(lengths[i]) + ")";
    at = end == std::string::npos ? end : end + 1;
  }
  long total = 0;
  for (long n : lengths)
    total += n;
  const bool many = lengths.size() > 1;
  throw std::invalid_argument("rootclad: entry " + std::to_string(entry) + ": column" +
                              (many ? "s " : " ") + cols + (many ? " hold " : " holds ") +
                              std::to_string(total) + " values; the model takes " +
                              std::to_string(expected));
}
} // namespace detail

template <class V, class Names>
const V& checked_event(const V& v, long expected, unsigned long long entry, const Names& names) {
  if ((long)v.size() != expected)
    detail::wrong_event(expected, entry, names, {(long)v.size()});
  return v;
}

template <class Names, class... Cols>
ROOT::RVecD event_input(long expected, unsigned long long entry, const Names& names,
                        const Cols&... cols) {
  const long n = (0 + ... + detail::column_length(cols));
  if (n != expected)
    detail::wrong_event(expected, entry, names, {detail::column_length(cols)...});
  ROOT::RVecD out;
  out.reserve(n);
  (detail::append_column(out, cols), ...);
  return out;
}

// One Model per RDataFrame processing slot (ROOT::EnableImplicitMT): Define expressions
// call slots[rdfslot_].score(x), so no two threads share a workspace.
class SlotModels {
public:
  SlotModels(const std::string& stem, unsigned n) {
    for (unsigned i = 0; i < (n ? n : 1); ++i)
      models_.emplace_back(new Model(stem));
  }
  Model& operator[](unsigned slot) { return *models_.at(slot); }
  unsigned size() const { return (unsigned)models_.size(); }

private:
  std::vector<std::unique_ptr<Model>> models_;
};

// Models of a distributed RDataFrame (define_score on a dataframe with an executor), opened in
// each process by rootclad.root.distributed from the copy of the export found there and found
// by Define expressions through a number (a hash of the files' content, the same in every
// process). One Model per thread, not per slot: a Dask worker runs tasks side by side in one
// process, each with its own event loop at slot 0.
namespace detail {
struct Shipped {
  std::string stem;
  std::string failure; // why it could not be opened here (thrown at its first use)
  std::map<std::thread::id, std::unique_ptr<Model>> models; // under shipped_mutex()
};
inline std::mutex& shipped_mutex() {
  static std::mutex m;
  return m;
}
inline std::map<std::uint64_t, Shipped>& shipped_models() {
  static std::map<std::uint64_t, Shipped> models; // never erased: Define code may point here
  return models;
}
inline std::map<std::uint64_t, std::string>& shipped_names() {
  static std::map<std::uint64_t, std::string> names;
  return names;
}
inline std::string names_text(ShippedNames names) {
  std::lock_guard<std::mutex> lock(shipped_mutex());
  const auto it = shipped_names().find(names.id);
  return it == shipped_names().end() ? "(unnamed)" : it->second;
}
} // namespace detail

// Opens `stem` as model `id` for the calling thread now (a bad file raises here, not in an
// event loop); false, opening nothing, when `id` is open in this process already.
inline bool open_shipped(std::uint64_t id, const std::string& stem) {
  std::lock_guard<std::mutex> lock(detail::shipped_mutex());
  const auto it = detail::shipped_models().find(id);
  if (it != detail::shipped_models().end() && it->second.failure.empty())
    return false;
  auto model = std::make_unique<Model>(stem);
  auto& entry = detail::shipped_models()[id];
  entry.stem = stem;
  entry.failure.clear();
  entry.models[std::this_thread::get_id()] = std::move(model);
  return true;
}

// Model `id` could not be opened in this process: its first use throws `why` (other models'
// Defines run on).
inline void shipped_failed(std::uint64_t id, const std::string& why) {
  std::lock_guard<std::mutex> lock(detail::shipped_mutex());
  auto& entry = detail::shipped_models()[id];
  if (entry.models.empty())
    entry.failure = why;
}

inline void register_shipped_names(std::uint64_t id, const std::string& names) {
  std::lock_guard<std::mutex> lock(detail::shipped_mutex());
  detail::shipped_names()[id] = names;
}

// The calling thread's Model `id` (opened on a thread's first call); throws when `id` was
// never opened in this process. Each thread finds its models in a list of its own (a pthread
// key: Cling's JIT mishandles thread_local shared by two Defines), the registry's lock taken
// only on a thread's first call for a model.
inline Model& shipped_model(std::uint64_t id) {
  using Cache = std::vector<std::pair<std::uint64_t, Model*>>;
  static const pthread_key_t key = [] {
    pthread_key_t k;
    if (pthread_key_create(&k, [](void* c) { delete static_cast<Cache*>(c); }) != 0)
      throw std::runtime_error("rootclad: pthread_key_create failed");
    return k;
  }();
  auto* cache = static_cast<Cache*>(pthread_getspecific(key));
  if (cache)
    for (const auto& [cached, model] : *cache)
      if (cached == id)
        return *model;
  std::lock_guard<std::mutex> lock(detail::shipped_mutex());
  const auto it = detail::shipped_models().find(id);
  if (it == detail::shipped_models().end())
    throw std::runtime_error(
        "rootclad: model " + std::to_string(id) +
        " is not open in this process: rootclad's set-up did not run on this worker "
        "(ROOT.RDF.Distributed.initialize keeps one function: call yours before define_score, "
        "which chains it)");
  if (!it->second.failure.empty())
    throw std::runtime_error(it->second.failure);
  auto& model = it->second.models[std::this_thread::get_id()];
  if (!model)
    model = std::make_unique<Model>(it->second.stem);
  if (!cache) {
    cache = new Cache;
    pthread_setspecific(key, cache);
  }
  cache->emplace_back(id, model.get());
  return *model;
}

} // namespace rootclad

#endif // ROOTCLAD_SCORING_H
