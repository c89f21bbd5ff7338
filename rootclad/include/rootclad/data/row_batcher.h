// rootclad/data/row_batcher.h — the plan, the shuffle buffer and batch assembly, shared by the
// readers. (part of rootclad/tree_reader.h, which says how the readers work).
#ifndef ROOTCLAD_DATA_ROW_BATCHER_H
#define ROOTCLAD_DATA_ROW_BATCHER_H

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

#include "tree_file.h"

namespace rootclad {
namespace data {

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
  bool weighted() const { return weighted_; }          // batches carry event weights
  long long batch_size() const { return batch_size_; }
  // Batches per epoch, the same on every rank (rootclad/data/schedule.py: a rank whose share
  // ran out first has an empty last batch: fill() returns 0 for it).
  long long batches_per_epoch() const {
    if (world_size_ == 1)
      return drop_last_ ? split_entries_ / batch_size_
                        : (split_entries_ + batch_size_ - 1) / batch_size_;
    const long long global = batch_size_ * world_size_, rem = split_entries_ % global;
    return split_entries_ / global + (rem > 0 && !drop_last_);
  }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // The entries this rank reads per epoch (its share; all of them with one rank).
  long long rank_entries() const {
    if (world_size_ == 1)
      return drop_last_ ? split_entries_ - split_entries_ % batch_size_ : split_entries_;
    return shard_size(rank_);
  }

  // split: "train", "validation" or "all" (the last validation_fraction of each
  // file is validation). block_size, buffer_blocks: the shuffle window. rank, world_size:
  // data-parallel training, each rank reading its own share of every epoch.
  void configure(long long batch_size, const std::string& split = "all",
                 double validation_fraction = 0.0, bool shuffle = true, unsigned long long seed = 0,
                 bool drop_last = false, long long block_size = 1024, long long buffer_blocks = 8,
                 bool check_finite = true, int rank = 0, int world_size = 1) {
    if (batch_size < 1 || block_size < 1 || buffer_blocks < 1)
      throw std::invalid_argument("rootclad::data: sizes must be at least 1");
    if (world_size < 1 || rank < 0 || rank >= world_size)
      throw std::invalid_argument("rootclad::data: rank must be in [0, world_size)");
    rank_ = rank;
    world_size_ = world_size;
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
    // this rank's pieces of the blocks, in read order: entries [lo, hi) of the epoch's stream
    long long lo = 0, hi = split_entries_, pos = 0;
    if (world_size_ > 1) {
      for (int r = 0; r < rank_; ++r)
        lo += shard_size(r);
      hi = lo + shard_size(rank_);
    }
    pieces_.clear();
    for (long long i : order_) {
      const Block& b = blocks_[i];
      const long long a = std::max(lo, pos), z = std::min(hi, pos + b.size());
      if (a < z)
        pieces_.push_back({b.file, b.start + a - pos, b.start + z - pos});
      pos += b.size();
    }
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
      const long long expected = rank_entries();
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

  // entries of the epoch rank r reads (rootclad/data/schedule.py: shard_sizes)
  long long shard_size(int r) const {
    const long long global = batch_size_ * world_size_;
    const long long q = split_entries_ / global, rem = drop_last_ ? 0 : split_entries_ % global;
    return q * batch_size_ + rem / world_size_ + (r < rem % world_size_ ? 1 : 0);
  }

  bool load_buffer() {
    if (next_block_ >= (long long)pieces_.size())
      return false;
    const long long end = std::min<long long>(next_block_ + buffer_blocks_, pieces_.size());
    long long rows = 0;
    for (long long i = next_block_; i < end; ++i)
      rows += pieces_[i].size();
    if ((long long)buf_y_.size() < rows) {
      buf_x_.resize(rows * N_);
      buf_y_.resize(rows);
      if (weighted_)
        buf_w_.resize(rows);
    }
    long long pos = 0;
    for (long long i = next_block_; i < end; ++i) {
      const Block& b = pieces_[i];
      read_rows(b.file, b.start, b.stop, &buf_x_[pos * N_], &buf_y_[pos],
                weighted_ ? &buf_w_[pos] : nullptr);
      pos += b.size();
    }
    if (shuffle_)
      permutation(perm_, rows, stream_key(seed_, epoch_, 1 + buffer_index_ * world_size_ + rank_));
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
  std::vector<Block> blocks_, pieces_; // the plan; this epoch's pieces of it for this rank
  int rank_ = 0, world_size_ = 1;
  long long batch_size_ = 256, buffer_blocks_ = 8, split_entries_ = 0;
  bool shuffle_ = true, drop_last_ = false;
  unsigned long long seed_ = 0, epoch_ = 0;
  std::vector<long long> order_, perm_;
  long long next_block_ = 0, buffer_index_ = 0, buf_rows_ = 0, buf_pos_ = 0, produced_ = 0;
  std::vector<float> buf_x_, buf_w_;
  std::vector<double> buf_y_;
};

} // namespace data
} // namespace rootclad

#endif // ROOTCLAD_DATA_ROW_BATCHER_H
