// rootclad/data/table_source.h — any numeric columns of one file: features, a target and an
// optional weight. (part of rootclad/tree_reader.h, which says how the readers work).
#ifndef ROOTCLAD_DATA_TABLE_SOURCE_H
#define ROOTCLAD_DATA_TABLE_SOURCE_H

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

#include "ntuple_columns.h"
#include "tree_file.h"

namespace rootclad {
namespace data {

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

// rvec: also RVec<T>. ROOT's dictionaries hold no RVec<signed char>: a macro that made it
// could not run twice in one session (Cling's second instantiation conflicts with ROOT's
// module), so signed char is read from std::vector only (ROOT writes Char_t, plain char).
template <class T, bool rvec = true> VectorColumn* vector_column_if(TClass* cls) {
  if (cls == TClass::GetClass(typeid(std::vector<T>)))
    return new VectorColumnOf<std::vector<T>>();
  if constexpr (rvec) {
    if (cls == TClass::GetClass(typeid(ROOT::RVec<T>)))
      return new VectorColumnOf<ROOT::RVec<T>>();
  }
  return nullptr;
}

// The vector and RVec element types rootclad reads (those of uproot's numeric interpretations).
inline VectorColumn* make_vector_column(TClass* cls) {
  VectorColumn* c = nullptr;
  (c = vector_column_if<float>(cls)) || (c = vector_column_if<double>(cls)) ||
      (c = vector_column_if<int>(cls)) || (c = vector_column_if<unsigned int>(cls)) ||
      (c = vector_column_if<Long64_t>(cls)) || (c = vector_column_if<ULong64_t>(cls)) ||
      (c = vector_column_if<short>(cls)) || (c = vector_column_if<unsigned short>(cls)) ||
      (c = vector_column_if<signed char, false>(cls)) ||
      (c = vector_column_if<unsigned char>(cls)) || (c = vector_column_if<char>(cls)) ||
      (c = vector_column_if<bool>(cls));
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
    if (!target.empty()) // none: rootclad::score_tree reads the features alone
      target_ = open_column(target, true);
    if (!weight.empty())
      weight_ = open_column(weight, true);
    set_offsets(features_.front().branch);
  }

  ~TableSource() {
    for (auto& c : features_)
      if (c.branch)
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

  // Reads entry `entry`: x (sum of widths), *y (unless y is null), and *w when weighted.
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
      if (c.nt)
        c.nt->copy(out);
      else if (c.vec)
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
    if (!y) {
    } else if (*y = scalar(target_, entry); target_.integral) {
      if (*y < (double)INT_MIN || *y > (double)INT_MAX) {
        std::ostringstream os;
        os << "label " << (target_.leaf ? target_.leaf->GetValueLong64(0) : (long long)*y)
           << " does not fit a 32-bit integer";
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
    std::shared_ptr<detail::NTupleColumn> nt;  // an RNTuple's fields
    int fixed = -1;                            // values per entry when fixed, else -1
    bool is_float = false, integral = false;
  };

  Column open_column(const std::string& name, bool scalar) {
    Column c;
    c.name = name;
    if (ntuple_) {
      std::string why;
      c.nt.reset(detail::make_ntuple_column(*ntuple_, name, scalar, why));
      if (!c.nt)
        fail(why == "no such branch" ? why
             : scalar                ? "expected one number per entry, " + why
                                     : "expected numbers: a scalar, a fixed-size array or a vector "
                                       "per entry, " +
                            why,
             true, name);
      c.fixed = c.nt->fixed;
      c.is_float = c.nt->is_float;
      c.integral = c.nt->integral;
      return c;
    }
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
    if (c.nt)
      return read_ntuple(c, entry);
    if (c.branch->GetEntry(entry) <= 0)
      fail_entry(c.name, entry, "cannot read the entry (truncated or corrupt file?)");
    if (c.vec)
      return c.vec->size();
    return c.leaf->GetLeafCount() ? c.leaf->GetLen() : c.fixed; // GetEntry read the count
  }

  double scalar(Column& c, long long entry) {
    if (c.nt) {
      read_ntuple(c, entry);
      return c.nt->value();
    }
    if (c.branch->GetEntry(entry) <= 0)
      fail_entry(c.name, entry, "cannot read the entry (truncated or corrupt file?)");
    return c.leaf->GetValue(0);
  }

  long long read_ntuple(Column& c, long long entry) {
    try {
      return c.nt->read(entry);
    } catch (const ROOT::RException& e) {
      fail_entry(c.name, entry, "cannot read the entry (" + first_line(e.what()) + ")");
    }
  }

  std::vector<Column> features_;
  Column target_, weight_;
};

} // namespace data
} // namespace rootclad

#endif // ROOTCLAD_DATA_TABLE_SOURCE_H
