// rootclad/data/tree_file.h — random numbers and permutations (schedule.py's), and one TTree of one
// file: opening, checks and error messages. (part of rootclad/tree_reader.h, which says how the
// readers work).
#ifndef ROOTCLAD_DATA_TREE_FILE_H
#define ROOTCLAD_DATA_TREE_FILE_H

#include <ROOT/RNTuple.hxx>
#include <ROOT/RNTupleReader.hxx>
#include <ROOT/RVec.hxx>
#include <TBranch.h>
#include <TBranchElement.h>
#include <TClass.h>
#include <TDirectory.h>
#include <TFile.h>
#include <TKey.h>
#include <TLeaf.h>
#include <TSystem.h>
#include <TTree.h>
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace rootclad {
namespace data {

// ---- random numbers and permutations (same as schedule.py) ----------------

inline std::uint64_t splitmix64_next(std::uint64_t& state) {
  state += 0x9E3779B97F4A7C15ULL;
  std::uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

inline std::uint64_t stream_key(std::uint64_t seed, std::uint64_t epoch, std::uint64_t stream) {
  return seed * 0xBF58476D1CE4E5B9ULL + epoch * 0xD1B54A32D192ED03ULL + stream;
}

// Fisher-Yates from the last item down: swap item i with item next() % (i + 1).
inline void permutation(std::vector<long long>& out, long long n, std::uint64_t key) {
  out.resize(n);
  for (long long i = 0; i < n; ++i)
    out[i] = i;
  std::uint64_t state = key;
  for (long long i = n - 1; i > 0; --i) {
    const long long j = static_cast<long long>(splitmix64_next(state) % (std::uint64_t)(i + 1));
    std::swap(out[i], out[j]);
  }
}

// True when no element is inf or nan. A float is not finite exactly when all
// its exponent bits are set; the branch-free integer loop stays fast even at
// Cling's -O1 (std::isfinite per element halved the reader's throughput there).
inline bool all_finite(const float* x, long long n) {
  std::uint32_t worst = 0x7f800000u;
  for (long long i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    const std::uint32_t exponent_gap = (bits & 0x7f800000u) ^ 0x7f800000u; // 0 iff not finite
    worst = exponent_gap < worst ? exponent_gap : worst;
  }
  return worst != 0;
}

// "a.root,b.root" -> {"a.root", "b.root"}: the file lists of macros' arguments.
inline std::vector<std::string> file_list(const std::string& comma_separated) {
  std::vector<std::string> names;
  std::stringstream list(comma_separated);
  for (std::string item; std::getline(list, item, ',');)
    if (!item.empty())
      names.push_back(item);
  return names;
}

struct Block {
  int file;
  long long start, stop;
  long long size() const { return stop - start; }
};

// The first line of an exception's message (ROOT::RException's what() carries a stack trace).
inline std::string first_line(const char* what) {
  const std::string s = what;
  return s.substr(0, s.find('\n'));
}

// ---- one TTree of one file: opening, checks and error messages ------------------

// Opens `tree` in `path` (a "dir/name" path too) and names the file, tree, branch
// and entry in every error it throws. The readers' sources derive from it.
class TreeFile {
public:
  TreeFile(const std::string& path, const std::string& tree) : path_(path), tree_name_(tree) {
    if (path.find("://") == std::string::npos && gSystem->AccessPathName(path.c_str()))
      fail("file not found");
    file_.reset(TFile::Open(path.c_str(), "READ"));
    if (!file_ || file_->IsZombie())
      fail("cannot open as a ROOT file (not ROOT, truncated or corrupt; ROOT's own message is "
           "above)");
    if (file_->TestBit(TFile::kRecovered))
      fail("the file was not closed properly (truncated?); ROOT had to recover it, refusing "
           "to read a possibly short tree");
    // Look at the key's class before reading the object: TDirectory::Get hands
    // back non-TObject classes (e.g. an RNTuple) as TObject*, and a dynamic_cast
    // of that crashes.
    const auto slash = tree.rfind('/');
    TDirectory* dir = slash == std::string::npos
                          ? file_.get()
                          : file_->GetDirectory(tree.substr(0, slash).c_str());
    TKey* key = dir ? dir->GetKey(tree.substr(slash == std::string::npos ? 0 : slash + 1).c_str())
                    : nullptr;
    if (!key)
      fail("no such tree in the file", true);
    if (std::string(key->GetClassName()) == "ROOT::RNTuple") {
      open_ntuple(key);
      return;
    }
    TClass* cls = TClass::GetClass(key->GetClassName());
    if (!cls || !cls->InheritsFrom(TTree::Class()))
      fail(std::string("'") + tree + "' is a " + key->GetClassName() +
               ", not a TTree or an RNTuple",
           true);
    tree_ = static_cast<TTree*>(key->ReadObj());
    if (!tree_)
      fail("cannot read the tree (truncated or corrupt file?)", true);
    entries_ = tree_->GetEntries();
  }
  TreeFile(const TreeFile&) = delete;
  TreeFile& operator=(const TreeFile&) = delete;

  long long entries() const { return entries_; }
  const std::string& path() const { return path_; }
  bool is_ntuple() const { return ntuple_ != nullptr; }
  // First entry of each basket of the first column read (of each cluster of an RNTuple), then
  // the entry count.
  const std::vector<long long>& basket_offsets() const { return offsets_; }

  [[noreturn]] void fail_entry(const std::string& branch, long long entry,
                               const std::string& what) const {
    std::ostringstream os;
    os << path_ << ": tree '" << tree_name_ << "', branch '" << branch << "', entry " << entry
       << ": " << what;
    throw std::runtime_error(os.str());
  }

  [[noreturn]] void fail(const std::string& what, bool with_tree = false,
                         const std::string& branch = "") const {
    std::ostringstream os;
    os << path_;
    if (with_tree)
      os << ": tree '" << tree_name_ << "'";
    if (!branch.empty())
      os << ", branch '" << branch << "'";
    os << ": " << what;
    throw std::runtime_error(os.str());
  }

protected:
  TBranch* branch(const std::string& name) const {
    TBranch* b = tree_->GetBranch(name.c_str());
    if (!b)
      fail("no such branch", true, name);
    return b;
  }
  void set_offsets(TBranch* br) {
    if (ntuple_) { // an RNTuple's clusters, for every field
      for (const auto& c : ntuple_->GetDescriptor().GetClusterIterable())
        offsets_.push_back((long long)c.GetFirstEntryIndex());
      std::sort(offsets_.begin(), offsets_.end());
      offsets_.push_back(entries_);
      if (offsets_.size() < 2 || offsets_.front() != 0)
        offsets_ = {0, entries_};
      return;
    }
    const int nb = br->GetWriteBasket();
    const Long64_t* first = br->GetBasketEntry();
    for (int b = 0; b < nb; ++b)
      offsets_.push_back(first[b]);
    offsets_.push_back(entries_);
    if (offsets_.size() < 2 || offsets_.front() != 0)
      offsets_ = {0, entries_};
  }

  // The RNTuple behind `key`: what the readers read instead of a TTree's branches.
  void open_ntuple(TKey* key) {
    try {
      std::unique_ptr<ROOT::RNTuple> anchor(key->ReadObject<ROOT::RNTuple>());
      if (!anchor)
        fail("cannot read the RNTuple (truncated or corrupt file?)", true);
      ntuple_ = ROOT::RNTupleReader::Open(*anchor);
    } catch (const ROOT::RException& e) {
      fail("cannot read the RNTuple (" + first_line(e.what()) + ")", true);
    }
    entries_ = (long long)ntuple_->GetNEntries();
  }

  std::string path_, tree_name_;
  std::unique_ptr<TFile> file_;
  TTree* tree_ = nullptr;                       // owned by file_
  std::unique_ptr<ROOT::RNTupleReader> ntuple_; // instead of tree_
  long long entries_ = 0;
  std::vector<long long> offsets_;
};

} // namespace data
} // namespace rootclad

#endif // ROOTCLAD_DATA_TREE_FILE_H
