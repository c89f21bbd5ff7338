// rootclad/data/table_reader.h — batches of features, targets and weights.
// (part of rootclad/tree_reader.h, which says how the readers work).
#ifndef ROOTCLAD_DATA_TABLE_READER_H
#define ROOTCLAD_DATA_TABLE_READER_H

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
#include "table_source.h"

namespace rootclad {
namespace data {

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
    ::rootclad::detail::report_uncaught_in_root_sessions();
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

#endif // ROOTCLAD_DATA_TABLE_READER_H
