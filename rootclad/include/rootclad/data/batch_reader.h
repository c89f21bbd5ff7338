// rootclad/data/batch_reader.h — GW batches: strain arrays and integer labels.
// (part of rootclad/tree_reader.h, which says how the readers work).
#ifndef ROOTCLAD_DATA_BATCH_READER_H
#define ROOTCLAD_DATA_BATCH_READER_H

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

#include "../uncaught.h"
#include "row_batcher.h"
#include "tree_source.h"

namespace rootclad {
namespace data {

// ---- GW batches: strain arrays and integer labels ---------------------------

class BatchReader : public RowBatcher {
public:
  // length: expected strain length N; -1 takes it from the first file.
  BatchReader(const std::vector<std::string>& files, const std::string& tree = "events",
              const std::string& strain = "strain", const std::string& label = "label",
              int length = -1) {
    ::rootclad::detail::report_uncaught_in_root_sessions();
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

} // namespace data
} // namespace rootclad

#endif // ROOTCLAD_DATA_BATCH_READER_H
