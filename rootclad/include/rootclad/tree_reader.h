// rootclad/tree_reader.h: batches of whitened strain and labels from TTrees.
//
// Header-only; needs ROOT (TFile, TTree). Works included from a root.exe
// macro, declared from PyROOT through Cling, or compiled with g++ against
// ROOT's headers and libraries (-lCore -lRIO -lTree).
//
// It follows the plan of rootclad/data/schedule.py (split, basket-aligned
// blocks, splitmix64 shuffling) exactly, so for the same files and settings
// it fills the same batches as rootclad.data.BatchIterator.
//
//   rootclad::data::BatchReader reader({"signal.root", "noise.root"});
//   reader.configure(/*batch_size=*/256, "train", /*validation_fraction=*/0.2,
//                    /*shuffle=*/true, /*seed=*/1);
//   std::vector<float> x(256 * reader.length());    // (B, N) row-major
//   std::vector<int> y(256);                        // (B,)
//   for (int epoch = 0; epoch < 10; ++epoch) {
//     reader.start_epoch(epoch);
//     while (long long n = reader.next_batch(x.data(), y.data())) { /* n rows */ }
//   }
//
// Bad input throws std::runtime_error whose message names the file, tree,
// branch and entry ("<file>: tree 'events', branch 'strain', entry 12: ...").
// An epoch is never silently short: every planned entry is read or it throws.
#ifndef ROOTCLAD_TREE_READER_H
#define ROOTCLAD_TREE_READER_H

#include <TBranch.h>
#include <TBranchElement.h>
#include <TClass.h>
#include <TDirectory.h>
#include <TFile.h>
#include <TKey.h>
#include <TLeaf.h>
#include <TSystem.h>
#include <TTree.h>

#include <ROOT/RVec.hxx>

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

struct Block {
  int file;
  long long start, stop;
  long long size() const { return stop - start; }
};

// ---- one input file ---------------------------------------------------------

class TreeSource {
public:
  TreeSource(const std::string& path, const std::string& tree, const std::string& strain,
             const std::string& label)
      : path_(path), tree_name_(tree), strain_name_(strain), label_name_(label) {
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
    TClass* cls = TClass::GetClass(key->GetClassName());
    if (!cls || !cls->InheritsFrom(TTree::Class()))
      fail(std::string("'") + tree + "' is a " + key->GetClassName() + ", not a TTree", true);
    tree_ = static_cast<TTree*>(key->ReadObj());
    if (!tree_)
      fail("cannot read the tree (truncated or corrupt file?)", true);
    strain_br_ = tree_->GetBranch(strain.c_str());
    if (!strain_br_)
      fail("no such branch", true, strain_name_);
    label_br_ = tree_->GetBranch(label.c_str());
    if (!label_br_)
      fail("no such branch", true, label_name_);
    entries_ = tree_->GetEntries();
    setup_strain();
    setup_label();
    const int nb = strain_br_->GetWriteBasket();
    const Long64_t* first = strain_br_->GetBasketEntry();
    for (int b = 0; b < nb; ++b)
      offsets_.push_back(first[b]);
    offsets_.push_back(entries_);
    if (offsets_.size() < 2 || offsets_.front() != 0)
      offsets_ = {0, entries_};
  }

  long long entries() const { return entries_; }
  int length() const { return length_; } // -1: variable-length branch, known per entry
  const std::vector<long long>& basket_offsets() const { return offsets_; }
  const std::string& path() const { return path_; }

  // Reads entry `entry` into x[0..N) and *y. N = expected length.
  void read(long long entry, float* x, int* y, int N, bool check_finite) {
    if (strain_br_->GetEntry(entry) <= 0)
      fail_entry(strain_name_, entry, "cannot read the entry (truncated or corrupt file?)");
    switch (kind_) {
    case Kind::Fixed:
      std::memcpy(x, fixed_.data(), sizeof(float) * N);
      break;
    case Kind::Vector:
      copy_var(vec_->data(), (long long)vec_->size(), x, N, entry);
      break;
    case Kind::RVec:
      copy_var(rvec_->data(), (long long)rvec_->size(), x, N, entry);
      break;
    case Kind::Counted:
      copy_var(fixed_.data(), (long long)strain_leaf_->GetLen(), x, N, entry);
      break;
    }
    if (check_finite && !all_finite(x, N)) {
      int i = 0;
      while (std::isfinite(x[i]))
        ++i;
      std::ostringstream os;
      os << "non-finite value (" << x[i] << ") at index " << i << " of the strain";
      fail_entry(strain_name_, entry, os.str());
    }
    if (label_br_->GetEntry(entry) <= 0)
      fail_entry(label_name_, entry, "cannot read the entry (truncated or corrupt file?)");
    const double v = label_leaf_->GetValue(0);
    if (!std::isfinite(v) || v != std::floor(v)) {
      std::ostringstream os;
      os << "label " << v << " is not an integer";
      fail_entry(label_name_, entry, os.str());
    }
    // labels are int: a wider value must not wrap (2**40 became INT_MIN); the Python reader
    // says the same words
    if (v < (double)INT_MIN || v > (double)INT_MAX) {
      std::ostringstream os;
      os << "label " << (label_integral_ ? label_leaf_->GetValueLong64(0) : (long long)v)
         << " does not fit a 32-bit integer";
      fail_entry(label_name_, entry, os.str());
    }
    *y = static_cast<int>(v);
  }

  // Number of strain elements of `entry` (reads it).
  long long entry_length(long long entry) {
    if (strain_br_->GetEntry(entry) <= 0)
      fail_entry(strain_name_, entry, "cannot read the entry (truncated or corrupt file?)");
    switch (kind_) {
    case Kind::Vector:
      return (long long)vec_->size();
    case Kind::RVec:
      return (long long)rvec_->size();
    case Kind::Counted:
      return (long long)strain_leaf_->GetLen();
    default:
      return length_;
    }
  }

  [[noreturn]] void fail_entry(const std::string& branch, long long entry,
                               const std::string& what) const {
    std::ostringstream os;
    os << path_ << ": tree '" << tree_name_ << "', branch '" << branch << "', entry " << entry
       << ": " << what;
    throw std::runtime_error(os.str());
  }

private:
  enum class Kind { Fixed, Counted, Vector, RVec };

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

  void copy_var(const float* src, long long n, float* x, int N, long long entry) {
    if (n != N) {
      std::ostringstream os;
      os << "strain has " << n << " elements, expected " << N;
      fail_entry(strain_name_, entry, os.str());
    }
    std::memcpy(x, src, sizeof(float) * N);
  }

  void setup_strain() {
    if (auto* be = dynamic_cast<TBranchElement*>(strain_br_)) {
      const std::string cls = be->GetClassName();
      if (cls == "vector<float>") {
        kind_ = Kind::Vector;
        vec_ = new std::vector<float>();
        strain_br_->SetAddress(&vec_);
      } else if (cls == "ROOT::VecOps::RVec<float>" || cls == "ROOT::RVec<float>") {
        kind_ = Kind::RVec;
        rvec_ = new ROOT::RVec<float>();
        strain_br_->SetAddress(&rvec_);
      } else {
        fail("expected a float[N] array or vector<float> per entry, found " + cls, true,
             strain_name_);
      }
      length_ = -1;
      return;
    }
    if (strain_br_->GetListOfLeaves()->GetEntries() != 1)
      fail("expected a single leaf", true, strain_name_);
    strain_leaf_ = static_cast<TLeaf*>(strain_br_->GetListOfLeaves()->At(0));
    // a scalar leaf ("strain/F") has one element too, but it is no strain array (the Python
    // reader says the same words)
    if (!strain_leaf_->GetLeafCount() &&
        std::string(strain_leaf_->GetTitle()).find('[') == std::string::npos)
      fail("expected a float[N] array or vector<float> per entry, found one number per entry", true,
           strain_name_);
    if (std::string(strain_leaf_->GetTypeName()) != "Float_t")
      fail(std::string("expected a float[N] array or vector<float> per entry, found ") +
               strain_leaf_->GetTypeName() + " (" + strain_br_->GetTitle() + ")",
           true, strain_name_);
    if (strain_leaf_->GetLeafCount()) {
      kind_ = Kind::Counted;
      length_ = -1;
      fixed_.resize(std::max(1, strain_leaf_->GetLeafCount()->GetMaximum()) *
                    std::max(1, strain_leaf_->GetLenStatic()));
    } else {
      kind_ = Kind::Fixed;
      length_ = strain_leaf_->GetLen();
      fixed_.resize(length_);
    }
    strain_br_->SetAddress(fixed_.data());
  }

  void setup_label() {
    if (dynamic_cast<TBranchElement*>(label_br_) || label_br_->GetListOfLeaves()->GetEntries() != 1)
      fail("label must be a number per entry", true, label_name_);
    label_leaf_ = static_cast<TLeaf*>(label_br_->GetListOfLeaves()->At(0));
    if (label_leaf_->GetLen() != 1 || label_leaf_->GetLeafCount())
      fail("label must be a number per entry", true, label_name_);
    // the leaf's own buffer holds the value; GetValue converts any numeric type
    const std::string type = label_leaf_->GetTypeName();
    label_integral_ =
        type != "Float_t" && type != "Double_t" && type != "Float16_t" && type != "Double32_t";
  }

public:
  ~TreeSource() {
    if (tree_) {
      strain_br_->ResetAddress();
    }
    delete vec_;
    delete rvec_;
  }
  TreeSource(const TreeSource&) = delete;
  TreeSource& operator=(const TreeSource&) = delete;

private:
  std::string path_, tree_name_, strain_name_, label_name_;
  std::unique_ptr<TFile> file_;
  TTree* tree_ = nullptr; // owned by file_
  TBranch* strain_br_ = nullptr;
  TBranch* label_br_ = nullptr;
  TLeaf* strain_leaf_ = nullptr;
  TLeaf* label_leaf_ = nullptr;
  bool label_integral_ = true;
  Kind kind_ = Kind::Fixed;
  int length_ = -1;
  long long entries_ = 0;
  std::vector<float> fixed_;
  std::vector<float>* vec_ = nullptr;
  ROOT::RVec<float>* rvec_ = nullptr;
  std::vector<long long> offsets_;
};

// ---- batches over several files -------------------------------------------

class BatchReader {
public:
  // length: expected strain length N; -1 takes it from the first file.
  BatchReader(const std::vector<std::string>& files, const std::string& tree = "events",
              const std::string& strain = "strain", const std::string& label = "label",
              int length = -1)
      : N_(length) {
    if (files.empty())
      throw std::runtime_error("rootclad::data::BatchReader: no input files given");
    for (const auto& f : files) {
      sources_.emplace_back(new TreeSource(f, tree, strain, label));
      TreeSource& s = *sources_.back();
      if (s.length() >= 0) {
        if (N_ < 0)
          N_ = s.length();
        else if (s.length() != N_) {
          std::ostringstream os;
          os << "strain arrays have " << s.length() << " elements, expected " << N_;
          s.fail_entry(strain, 0, os.str());
        }
      }
    }
    if (N_ < 0) { // only variable-length branches: the first entry decides
      for (auto& s : sources_)
        if (s->entries() > 0) {
          N_ = (int)s->entry_length(0);
          break;
        }
      if (N_ < 0)
        throw std::runtime_error("rootclad::data::BatchReader: cannot tell the strain length: "
                                 "every file is empty");
    }
    configure(256);
  }

  int length() const { return N_; }
  int files() const { return (int)sources_.size(); }
  long long file_entries(int f) const { return sources_.at(f)->entries(); }
  // First entry of each basket of the strain branch of file f, then its entry count.
  std::vector<long long> basket_offsets(int f) const { return sources_.at(f)->basket_offsets(); }
  long long entries() const { return split_entries_; } // in the configured split
  long long batch_size() const { return batch_size_; }
  long long batches_per_epoch() const {
    return drop_last_ ? split_entries_ / batch_size_
                      : (split_entries_ + batch_size_ - 1) / batch_size_;
  }

  // split: "train", "validation" or "all" (the last validation_fraction of each
  // file is validation). block_size, buffer_blocks: the shuffle window.
  void configure(long long batch_size, const std::string& split = "all",
                 double validation_fraction = 0.0, bool shuffle = true, unsigned long long seed = 0,
                 bool drop_last = false, long long block_size = 1024, long long buffer_blocks = 8,
                 bool check_finite = true) {
    if (batch_size < 1 || block_size < 1 || buffer_blocks < 1)
      throw std::invalid_argument("rootclad::data::BatchReader: sizes must be at least 1");
    if (!(validation_fraction >= 0.0 && validation_fraction < 1.0))
      throw std::invalid_argument("rootclad::data::BatchReader: validation_fraction must be in "
                                  "[0, 1)");
    if (split != "train" && split != "validation" && split != "all")
      throw std::invalid_argument("rootclad::data::BatchReader: split must be 'train', "
                                  "'validation' or 'all'");
    batch_size_ = batch_size;
    shuffle_ = shuffle;
    seed_ = seed;
    drop_last_ = drop_last;
    buffer_blocks_ = buffer_blocks;
    check_finite_ = check_finite;
    blocks_.clear();
    for (int f = 0; f < (int)sources_.size(); ++f) {
      const long long n = sources_[f]->entries();
      const long long n_val = (long long)std::floor(validation_fraction * (double)n + 0.5);
      long long lo = 0, hi = n;
      if (split == "train")
        hi = n - n_val;
      else if (split == "validation")
        lo = n - n_val;
      add_blocks(f, lo, hi, block_size);
    }
    split_entries_ = 0;
    for (const auto& b : blocks_)
      split_entries_ += b.size();
    start_epoch(0);
  }

  // Starts epoch `epoch` (the shuffle depends on it).
  void start_epoch(unsigned long long epoch) {
    epoch_ = epoch;
    order_.clear();
    if (shuffle_)
      permutation(order_, (long long)blocks_.size(), stream_key(seed_, epoch_, 0));
    else
      for (long long i = 0; i < (long long)blocks_.size(); ++i)
        order_.push_back(i);
    next_block_ = 0;
    buffer_index_ = 0;
    buf_rows_ = buf_pos_ = 0;
    produced_ = 0;
  }

  // Fills x (B, N) and y (B,) with the next batch; returns its size, 0 at the end
  // of the epoch. The last batch is shorter unless drop_last.
  long long next_batch(float* x, int* y) {
    long long filled = 0;
    while (filled < batch_size_) {
      if (buf_pos_ == buf_rows_ && !load_buffer())
        break;
      const long long take = std::min(batch_size_ - filled, buf_rows_ - buf_pos_);
      for (long long i = 0; i < take; ++i) {
        const long long r = shuffle_ ? perm_[buf_pos_ + i] : buf_pos_ + i;
        std::memcpy(x + (filled + i) * N_, &buf_x_[r * N_], sizeof(float) * N_);
        y[filled + i] = buf_y_[r];
      }
      filled += take;
      buf_pos_ += take;
    }
    if (filled < batch_size_ && drop_last_)
      filled = 0;
    produced_ += filled;
    if (filled == 0) {
      const long long expected =
          drop_last_ ? split_entries_ - split_entries_ % batch_size_ : split_entries_;
      if (produced_ != expected) { // a bug, never bad input: fail loudly
        std::ostringstream os;
        os << "rootclad::data::BatchReader: epoch produced " << produced_ << " entries, planned "
           << expected;
        throw std::logic_error(os.str());
      }
    }
    return filled;
  }

  // Reads entries [start, stop) of file `file` in order into x (n, N), y (n,).
  void read_range(int file, long long start, long long stop, float* x, int* y) {
    TreeSource& s = *sources_.at(file);
    if (start < 0 || stop > s.entries() || start > stop)
      throw std::out_of_range("rootclad::data::BatchReader::read_range: bad entry range");
    for (long long e = start; e < stop; ++e)
      s.read(e, x + (e - start) * N_, y + (e - start), N_, check_finite_);
  }

  // The planned blocks (file, start, stop), flattened, for tests and tools.
  std::vector<long long> plan() const {
    std::vector<long long> out;
    for (const auto& b : blocks_) {
      out.push_back(b.file);
      out.push_back(b.start);
      out.push_back(b.stop);
    }
    return out;
  }

private:
  void add_blocks(int f, long long lo, long long hi, long long block_size) {
    const auto& off = sources_[f]->basket_offsets();
    long long start = lo, cur = lo;
    for (size_t b = 0; b + 1 < off.size(); ++b) {
      const long long b_lo = std::max(off[b], lo), b_hi = std::min(off[b + 1], hi);
      if (b_hi <= b_lo)
        continue;
      if (cur > start && b_hi - start > block_size) {
        blocks_.push_back({f, start, cur});
        start = b_lo;
      }
      cur = b_hi;
    }
    if (cur > start)
      blocks_.push_back({f, start, cur});
  }

  bool load_buffer() {
    if (next_block_ >= (long long)order_.size())
      return false;
    const long long end = std::min<long long>(next_block_ + buffer_blocks_, order_.size());
    long long rows = 0;
    for (long long i = next_block_; i < end; ++i)
      rows += blocks_[order_[i]].size();
    if ((long long)buf_y_.size() < rows) {
      buf_x_.resize(rows * N_);
      buf_y_.resize(rows);
    }
    long long pos = 0;
    for (long long i = next_block_; i < end; ++i) {
      const Block& b = blocks_[order_[i]];
      read_range(b.file, b.start, b.stop, &buf_x_[pos * N_], &buf_y_[pos]);
      pos += b.size();
    }
    if (shuffle_)
      permutation(perm_, rows, stream_key(seed_, epoch_, 1 + buffer_index_));
    next_block_ = end;
    ++buffer_index_;
    buf_rows_ = rows;
    buf_pos_ = 0;
    return true;
  }

  std::vector<std::unique_ptr<TreeSource>> sources_;
  int N_ = -1;
  std::vector<Block> blocks_;
  long long batch_size_ = 256, buffer_blocks_ = 8, split_entries_ = 0;
  bool shuffle_ = true, drop_last_ = false, check_finite_ = true;
  unsigned long long seed_ = 0, epoch_ = 0;
  std::vector<long long> order_, perm_;
  long long next_block_ = 0, buffer_index_ = 0, buf_rows_ = 0, buf_pos_ = 0, produced_ = 0;
  std::vector<float> buf_x_;
  std::vector<int> buf_y_;
};

} // namespace data
} // namespace rootclad

#endif // ROOTCLAD_TREE_READER_H
