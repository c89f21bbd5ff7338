// rootclad/tree_reader.h: training batches from TTrees: the GW strain and labels
// (BatchReader) and any numeric columns with a target and weights (TableReader).
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
    TClass* cls = TClass::GetClass(key->GetClassName());
    if (!cls || !cls->InheritsFrom(TTree::Class()))
      fail(std::string("'") + tree + "' is a " + key->GetClassName() + ", not a TTree", true);
    tree_ = static_cast<TTree*>(key->ReadObj());
    if (!tree_)
      fail("cannot read the tree (truncated or corrupt file?)", true);
    entries_ = tree_->GetEntries();
  }
  TreeFile(const TreeFile&) = delete;
  TreeFile& operator=(const TreeFile&) = delete;

  long long entries() const { return entries_; }
  const std::string& path() const { return path_; }
  // First entry of each basket of the first column read, then the entry count.
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
    const int nb = br->GetWriteBasket();
    const Long64_t* first = br->GetBasketEntry();
    for (int b = 0; b < nb; ++b)
      offsets_.push_back(first[b]);
    offsets_.push_back(entries_);
    if (offsets_.size() < 2 || offsets_.front() != 0)
      offsets_ = {0, entries_};
  }

  std::string path_, tree_name_;
  std::unique_ptr<TFile> file_;
  TTree* tree_ = nullptr; // owned by file_
  long long entries_ = 0;
  std::vector<long long> offsets_;
};

// ---- the GW strain and label of one file ---------------------------------------

// No label ("", rootclad::score_tree): read() fills the strain alone.
class TreeSource : public TreeFile {
public:
  TreeSource(const std::string& path, const std::string& tree, const std::string& strain,
             const std::string& label = "")
      : TreeFile(path, tree), strain_name_(strain), label_name_(label) {
    strain_br_ = branch(strain);
    setup_strain();
    if (!label.empty()) {
      label_br_ = branch(label);
      setup_label();
    }
    set_offsets(strain_br_);
  }

  int length() const { return length_; } // -1: variable-length branch, known per entry

  // Reads entry `entry` into x[0..N) and *y (with a label). N = expected length.
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
    if (!label_br_)
      return;
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

private:
  enum class Kind { Fixed, Counted, Vector, RVec };

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

private:
  std::string strain_name_, label_name_;
  TBranch* strain_br_ = nullptr;
  TBranch* label_br_ = nullptr;
  TLeaf* strain_leaf_ = nullptr;
  TLeaf* label_leaf_ = nullptr;
  bool label_integral_ = true;
  Kind kind_ = Kind::Fixed;
  int length_ = -1;
  std::vector<float> fixed_;
  std::vector<float>* vec_ = nullptr;
  ROOT::RVec<float>* rvec_ = nullptr;
};

// ---- the plan, the shuffle buffer and batch assembly, shared by the readers ----

// Rows of `width()` floats, a target (held as double: an int label or a float
// target is exact in it) and an optional weight, read block by block from
// several files and handed out in shuffled batches. A reader derives from it
// and supplies the files' entry counts, basket offsets and read_rows().
class RowBatcher {
public:
  virtual ~RowBatcher() = default;

  int length() const { return N_; }
  int files() const { return (int)entries_.size(); }
  long long file_entries(int f) const { return entries_.at(f); }
  // First entry of each basket of file f's first column, then its entry count.
  std::vector<long long> basket_offsets(int f) const { return offsets_.at(f); }
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
      throw std::invalid_argument("rootclad::data: sizes must be at least 1");
    if (!(validation_fraction >= 0.0 && validation_fraction < 1.0))
      throw std::invalid_argument("rootclad::data: validation_fraction must be in [0, 1)");
    if (split != "train" && split != "validation" && split != "all")
      throw std::invalid_argument("rootclad::data: split must be 'train', 'validation' or 'all'");
    batch_size_ = batch_size;
    shuffle_ = shuffle;
    seed_ = seed;
    drop_last_ = drop_last;
    buffer_blocks_ = buffer_blocks;
    check_finite_ = check_finite;
    blocks_.clear();
    for (int f = 0; f < files(); ++f) {
      const long long n = entries_[f];
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

protected:
  // Reads entries [start, stop) of file `file` in order: x (n, N), y (n,), w (n,) or null.
  virtual void read_rows(int file, long long start, long long stop, float* x, double* y,
                         float* w) = 0;

  // Called by the derived constructor once the files are open.
  void set_files(std::vector<long long> entries, std::vector<std::vector<long long>> offsets,
                 int width, bool weighted) {
    entries_ = std::move(entries);
    offsets_ = std::move(offsets);
    N_ = width;
    weighted_ = weighted;
    configure(256);
  }

  void check_range(int file, long long start, long long stop) const {
    if (file < 0 || file >= files() || start < 0 || stop > entries_[file] || start > stop)
      throw std::out_of_range("rootclad::data: bad entry range");
  }

  // Fills x (B, N), y (B,) and w (B,) when not null with the next batch; returns
  // its size, 0 at the end of the epoch. The last batch is shorter unless drop_last.
  template <class Y> long long fill(float* x, Y* y, float* w) {
    long long filled = 0;
    while (filled < batch_size_) {
      if (buf_pos_ == buf_rows_ && !load_buffer())
        break;
      const long long take = std::min(batch_size_ - filled, buf_rows_ - buf_pos_);
      for (long long i = 0; i < take; ++i) {
        const long long r = shuffle_ ? perm_[buf_pos_ + i] : buf_pos_ + i;
        std::memcpy(x + (filled + i) * N_, &buf_x_[r * N_], sizeof(float) * N_);
        y[filled + i] = static_cast<Y>(buf_y_[r]);
        if (w)
          w[filled + i] = buf_w_[r];
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
        os << "rootclad::data: epoch produced " << produced_ << " entries, planned " << expected;
        throw std::logic_error(os.str());
      }
    }
    return filled;
  }

  bool check_finite_ = true;

private:
  void add_blocks(int f, long long lo, long long hi, long long block_size) {
    const auto& off = offsets_[f];
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
      if (weighted_)
        buf_w_.resize(rows);
    }
    long long pos = 0;
    for (long long i = next_block_; i < end; ++i) {
      const Block& b = blocks_[order_[i]];
      read_rows(b.file, b.start, b.stop, &buf_x_[pos * N_], &buf_y_[pos],
                weighted_ ? &buf_w_[pos] : nullptr);
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

  std::vector<long long> entries_;
  std::vector<std::vector<long long>> offsets_;
  int N_ = -1;
  bool weighted_ = false;
  std::vector<Block> blocks_;
  long long batch_size_ = 256, buffer_blocks_ = 8, split_entries_ = 0;
  bool shuffle_ = true, drop_last_ = false;
  unsigned long long seed_ = 0, epoch_ = 0;
  std::vector<long long> order_, perm_;
  long long next_block_ = 0, buffer_index_ = 0, buf_rows_ = 0, buf_pos_ = 0, produced_ = 0;
  std::vector<float> buf_x_, buf_w_;
  std::vector<double> buf_y_;
};

// ---- GW batches: strain arrays and integer labels ---------------------------

class BatchReader : public RowBatcher {
public:
  // length: expected strain length N; -1 takes it from the first file.
  BatchReader(const std::vector<std::string>& files, const std::string& tree = "events",
              const std::string& strain = "strain", const std::string& label = "label",
              int length = -1) {
    if (files.empty())
      throw std::runtime_error("rootclad::data::BatchReader: no input files given");
    int N = length;
    for (const auto& f : files) {
      sources_.emplace_back(new TreeSource(f, tree, strain, label));
      TreeSource& s = *sources_.back();
      if (s.length() >= 0) {
        if (N < 0)
          N = s.length();
        else if (s.length() != N) {
          std::ostringstream os;
          os << "strain arrays have " << s.length() << " elements, expected " << N;
          s.fail_entry(strain, 0, os.str());
        }
      }
    }
    if (N < 0) { // only variable-length branches: the first entry decides
      for (auto& s : sources_)
        if (s->entries() > 0) {
          N = (int)s->entry_length(0);
          break;
        }
      if (N < 0)
        throw std::runtime_error("rootclad::data::BatchReader: cannot tell the strain length: "
                                 "every file is empty");
    }
    std::vector<long long> entries;
    std::vector<std::vector<long long>> offsets;
    for (auto& s : sources_) {
      entries.push_back(s->entries());
      offsets.push_back(s->basket_offsets());
    }
    set_files(std::move(entries), std::move(offsets), N, false);
  }

  // Fills x (B, N) and y (B,) with the next batch; returns its size, 0 at the end
  // of the epoch. The last batch is shorter unless drop_last.
  long long next_batch(float* x, int* y) { return fill(x, y, nullptr); }

  // Reads entries [start, stop) of file `file` in order into x (n, N), y (n,).
  void read_range(int file, long long start, long long stop, float* x, int* y) {
    check_range(file, start, stop);
    TreeSource& s = *sources_[file];
    for (long long e = start; e < stop; ++e)
      s.read(e, x + (e - start) * length(), y + (e - start), length(), check_finite_);
  }

protected:
  void read_rows(int file, long long start, long long stop, float* x, double* y, float*) override {
    TreeSource& s = *sources_[file];
    for (long long e = start; e < stop; ++e) {
      int label;
      s.read(e, x + (e - start) * length(), &label, length(), check_finite_);
      y[e - start] = label;
    }
  }

private:
  std::vector<std::unique_ptr<TreeSource>> sources_;
};

// ---- any numeric columns: features, a target and an optional weight ----------

namespace detail {

// A std::vector<T> or RVec<T> branch, read through its own object.
struct VectorColumn {
  virtual ~VectorColumn() = default;
  virtual void attach(TBranch* b) = 0;
  virtual long long size() const = 0;
  virtual void copy(float* out) const = 0; // size() values, converted to float
};

template <class V> struct VectorColumnOf : VectorColumn {
  V* v = new V();
  ~VectorColumnOf() override { delete v; }
  void attach(TBranch* b) override { b->SetAddress(&v); }
  long long size() const override { return (long long)v->size(); }
  void copy(float* out) const override {
    for (size_t i = 0; i < v->size(); ++i)
      out[i] = static_cast<float>((*v)[i]);
  }
};

template <class T> VectorColumn* vector_column_if(TClass* cls) {
  if (cls == TClass::GetClass(typeid(std::vector<T>)))
    return new VectorColumnOf<std::vector<T>>();
  if (cls == TClass::GetClass(typeid(ROOT::RVec<T>)))
    return new VectorColumnOf<ROOT::RVec<T>>();
  return nullptr;
}

// The vector and RVec element types rootclad reads (those of uproot's numeric interpretations).
inline VectorColumn* make_vector_column(TClass* cls) {
  VectorColumn* c = nullptr;
  (c = vector_column_if<float>(cls)) || (c = vector_column_if<double>(cls)) ||
      (c = vector_column_if<int>(cls)) || (c = vector_column_if<unsigned int>(cls)) ||
      (c = vector_column_if<Long64_t>(cls)) || (c = vector_column_if<ULong64_t>(cls)) ||
      (c = vector_column_if<short>(cls)) || (c = vector_column_if<unsigned short>(cls)) ||
      (c = vector_column_if<signed char>(cls)) || (c = vector_column_if<unsigned char>(cls)) ||
      (c = vector_column_if<char>(cls)) || (c = vector_column_if<bool>(cls));
  return c;
}

inline bool integral_leaf(TLeaf* leaf) {
  const std::string type = leaf->GetTypeName();
  return type != "Float_t" && type != "Double_t" && type != "Float16_t" && type != "Double32_t";
}

} // namespace detail

// One TTree of one file, read as rows: the features concatenated (float), a
// target (double: integral or floating-point) and an optional weight.
class TableSource : public TreeFile {
public:
  TableSource(const std::string& path, const std::string& tree,
              const std::vector<std::string>& features, const std::string& target,
              const std::string& weight)
      : TreeFile(path, tree) {
    for (const auto& name : features)
      features_.push_back(open_column(name, false));
    target_ = open_column(target, true);
    if (!weight.empty())
      weight_ = open_column(weight, true);
    set_offsets(features_.front().branch);
  }

  ~TableSource() {
    for (auto& c : features_)
      c.branch->ResetAddress();
  }

  // Values per entry of each feature: fixed ones from the branch, the others
  // from the first entry (0 for an empty tree); checked on every entry read.
  std::vector<int> widths() {
    std::vector<int> out;
    for (auto& c : features_)
      out.push_back(c.fixed >= 0 ? c.fixed : entries_ > 0 ? (int)entry_width(c, 0) : 0);
    return out;
  }

  // Reads entry `entry`: x (sum of widths), *y, and *w when weighted.
  void read(long long entry, const std::vector<int>& widths, float* x, double* y, float* w,
            bool check_finite) {
    float* out = x;
    for (size_t i = 0; i < features_.size(); ++i) {
      Column& c = features_[i];
      const long long n = entry_width(c, entry);
      if (n != widths[i]) {
        std::ostringstream os;
        os << n << " values where the first entry had " << widths[i];
        fail_entry(c.name, entry, os.str());
      }
      if (c.vec)
        c.vec->copy(out);
      else if (c.is_float)
        std::memcpy(out, c.leaf->GetValuePointer(), sizeof(float) * n);
      else
        for (long long k = 0; k < n; ++k)
          out[k] = static_cast<float>(c.leaf->GetValue((int)k));
      if (check_finite && !all_finite(out, n)) {
        long long k = 0;
        while (std::isfinite(out[k]))
          ++k;
        std::ostringstream os;
        os << "non-finite value (" << out[k] << ") in a feature";
        fail_entry(c.name, entry, os.str());
      }
      out += n;
    }
    *y = scalar(target_, entry);
    if (target_.integral) {
      if (*y < (double)INT_MIN || *y > (double)INT_MAX) {
        std::ostringstream os;
        os << "label " << target_.leaf->GetValueLong64(0) << " does not fit a 32-bit integer";
        fail_entry(target_.name, entry, os.str());
      }
    } else if (!std::isfinite((float)*y)) {
      std::ostringstream os;
      os << "non-finite target (" << (float)*y << ")";
      fail_entry(target_.name, entry, os.str());
    }
    if (w) {
      *w = (float)scalar(weight_, entry);
      if (!std::isfinite(*w)) {
        std::ostringstream os;
        os << "non-finite weight (" << *w << ")";
        fail_entry(weight_.name, entry, os.str());
      }
    }
  }

  bool integral_target() const { return target_.integral; }

private:
  struct Column {
    std::string name;
    TBranch* branch = nullptr;
    TLeaf* leaf = nullptr;                     // leaf columns
    std::shared_ptr<detail::VectorColumn> vec; // vector/RVec columns
    int fixed = -1;                            // values per entry when fixed, else -1
    bool is_float = false, integral = false;
  };

  Column open_column(const std::string& name, bool scalar) {
    Column c;
    c.name = name;
    c.branch = branch(name);
    if (auto* be = dynamic_cast<TBranchElement*>(c.branch)) {
      TClass* cls = TClass::GetClass(be->GetClassName());
      detail::VectorColumn* vec = cls ? detail::make_vector_column(cls) : nullptr;
      if (!vec || scalar)
        fail(std::string(scalar ? "expected one number per entry"
                                : "expected numbers: a "
                                  "scalar, a fixed-size array or a vector per entry") +
                 ", found " + be->GetClassName(),
             true, name);
      c.vec.reset(vec);
      c.vec->attach(c.branch);
      return c;
    }
    if (c.branch->GetListOfLeaves()->GetEntries() != 1)
      fail("expected a single leaf", true, name);
    c.leaf = static_cast<TLeaf*>(c.branch->GetListOfLeaves()->At(0));
    const std::string type = c.leaf->GetTypeName();
    static const char* numeric[] = {"Float_t",   "Double_t", "Int_t",    "UInt_t",    "Long64_t",
                                    "ULong64_t", "Short_t",  "UShort_t", "Char_t",    "UChar_t",
                                    "Bool_t",    "Long_t",   "ULong_t",  "Float16_t", "Double32_t"};
    if (std::find_if(std::begin(numeric), std::end(numeric),
                     [&](const char* t) { return type == t; }) == std::end(numeric))
      fail("expected numbers, found " + type, true, name);
    const std::string title = c.leaf->GetTitle();
    const auto brackets = std::count(title.begin(), title.end(), '[');
    if (brackets > 1)
      fail("expected numbers: a scalar, a fixed-size array or a vector per entry, found the "
           "multi-dimensional array " +
               title,
           true, name);
    if (scalar && (brackets || c.leaf->GetLeafCount() || c.leaf->GetLen() != 1))
      fail("expected one number per entry, found " + title, true, name);
    c.is_float = type == "Float_t";
    c.integral = detail::integral_leaf(c.leaf);
    c.fixed = c.leaf->GetLeafCount() ? -1 : c.leaf->GetLen();
    return c;
  }

  long long entry_width(Column& c, long long entry) {
    if (c.branch->GetEntry(entry) <= 0)
      fail_entry(c.name, entry, "cannot read the entry (truncated or corrupt file?)");
    if (c.vec)
      return c.vec->size();
    return c.leaf->GetLeafCount() ? c.leaf->GetLen() : c.fixed; // GetEntry read the count
  }

  double scalar(Column& c, long long entry) {
    if (c.branch->GetEntry(entry) <= 0)
      fail_entry(c.name, entry, "cannot read the entry (truncated or corrupt file?)");
    return c.leaf->GetValue(0);
  }

  std::vector<Column> features_;
  Column target_, weight_;
};

// Batches of rows from numeric columns of one or more files: the C++ twin of
// rootclad.data.TableIterator (same plan, shuffle and checks, same batches).
//
//   rootclad::data::TableReader r({"ttbar.root"}, "t", {"jet_pt", "jet_eta", "met"},
//                                 "is_signal", "w");
//   r.configure(512, "train", 0.2, true, 1);
//   std::vector<float> x(512 * r.length()), w(512);
//   std::vector<int> y(512);          // float y when !r.integral_target()
//   while (long long n = r.next_batch(x.data(), y.data(), w.data())) { ... }
class TableReader : public RowBatcher {
public:
  TableReader(const std::vector<std::string>& files, const std::string& tree,
              const std::vector<std::string>& features, const std::string& target,
              const std::string& weight = "") {
    if (files.empty())
      throw std::runtime_error("rootclad::data::TableReader: no input files given");
    if (features.empty())
      throw std::runtime_error("rootclad::data::TableReader: no feature columns given");
    std::vector<long long> entries;
    std::vector<std::vector<long long>> offsets;
    for (const auto& f : files) {
      sources_.emplace_back(new TableSource(f, tree, features, target, weight));
      TableSource& s = *sources_.back();
      const std::vector<int> w = s.widths();
      if (sources_.size() == 1) {
        widths_ = w;
        integral_ = s.integral_target();
      } else if (w != widths_) {
        std::ostringstream os;
        os << "feature lengths ";
        for (size_t i = 0; i < w.size(); ++i)
          os << (i ? ", " : "{") << "'" << features[i] << "': " << w[i];
        os << "} differ from the first file's";
        for (size_t i = 0; i < w.size(); ++i)
          os << (i ? ", " : " {") << "'" << features[i] << "': " << widths_[i];
        os << "}";
        s.fail(os.str(), true);
      } else if (s.integral_target() != integral_) {
        s.fail("the target is integral in one file and floating-point in another", true, target);
      }
      entries.push_back(s.entries());
      offsets.push_back(s.basket_offsets());
    }
    int total = 0;
    for (int v : widths_)
      total += v;
    set_files(std::move(entries), std::move(offsets), total, !weight.empty());
  }

  bool integral_target() const { return integral_; }
  std::vector<int> widths() const { return widths_; }

  // The next batch: x (B, length()), y (B,), w (B,) (ignored when no weight column).
  // Integer y for an integral target, float y otherwise.
  long long next_batch(float* x, int* y, float* w = nullptr) {
    require(true);
    return fill(x, y, w);
  }
  long long next_batch(float* x, float* y, float* w = nullptr) {
    require(false);
    return fill(x, y, w);
  }

  // Entries [start, stop) of file `file` in order.
  void read_range(int file, long long start, long long stop, float* x, int* y, float* w = nullptr) {
    require(true);
    read_as(file, start, stop, x, y, w);
  }
  void read_range(int file, long long start, long long stop, float* x, float* y,
                  float* w = nullptr) {
    require(false);
    read_as(file, start, stop, x, y, w);
  }

protected:
  void read_rows(int file, long long start, long long stop, float* x, double* y,
                 float* w) override {
    TableSource& s = *sources_[file];
    for (long long e = start; e < stop; ++e)
      s.read(e, widths_, x + (e - start) * length(), y + (e - start), w ? w + (e - start) : nullptr,
             check_finite_);
  }

private:
  void require(bool integral) const {
    if (integral != integral_)
      throw std::invalid_argument(
          std::string("rootclad::data::TableReader: the target is ") +
          (integral_ ? "integral: pass int labels" : "floating-point: pass float targets"));
  }

  template <class Y>
  void read_as(int file, long long start, long long stop, float* x, Y* y, float* w) {
    check_range(file, start, stop);
    TableSource& s = *sources_[file];
    double target;
    for (long long e = start; e < stop; ++e) {
      s.read(e, widths_, x + (e - start) * length(), &target, w ? w + (e - start) : nullptr,
             check_finite_);
      y[e - start] = static_cast<Y>(target);
    }
  }

  std::vector<std::unique_ptr<TableSource>> sources_;
  std::vector<int> widths_;
  bool integral_ = true;
};

} // namespace data
} // namespace rootclad

#endif // ROOTCLAD_TREE_READER_H
