// rootclad/data/tree_source.h — the GW strain and label of one file.
// (part of rootclad/tree_reader.h, which says how the readers work).
#ifndef ROOTCLAD_DATA_TREE_SOURCE_H
#define ROOTCLAD_DATA_TREE_SOURCE_H

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

// ---- the GW strain and label of one file ---------------------------------------

// No label ("", rootclad::score_tree): read() fills the strain alone.
class TreeSource : public TreeFile {
public:
  TreeSource(const std::string& path, const std::string& tree, const std::string& strain,
             const std::string& label = "")
      : TreeFile(path, tree), strain_name_(strain), label_name_(label) {
    if (ntuple_) {
      open_ntuple_fields();
      return;
    }
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
    if (strain_nt_) {
      copy_ntuple(x, N, entry, check_finite, y);
      return;
    }
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
    check_strain(x, N, entry, check_finite);
    if (!label_br_)
      return;
    if (label_br_->GetEntry(entry) <= 0)
      fail_entry(label_name_, entry, "cannot read the entry (truncated or corrupt file?)");
    *y = check_label(label_leaf_->GetValue(0), entry);
  }

  // Number of strain elements of `entry` (reads it).
  long long entry_length(long long entry) {
    if (strain_nt_)
      return ntuple_read(*strain_nt_, strain_name_, entry);
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

  void check_strain(const float* x, int N, long long entry, bool check_finite) {
    if (check_finite && !all_finite(x, N)) {
      int i = 0;
      while (std::isfinite(x[i]))
        ++i;
      std::ostringstream os;
      os << "non-finite value (" << x[i] << ") at index " << i << " of the strain";
      fail_entry(strain_name_, entry, os.str());
    }
  }

  // A label read as a double, checked and converted (the Python reader says the same words).
  int check_label(double v, long long entry) {
    if (!std::isfinite(v) || v != std::floor(v)) {
      std::ostringstream os;
      os << "label " << v << " is not an integer";
      fail_entry(label_name_, entry, os.str());
    }
    // labels are int: a wider value must not wrap (2**40 became INT_MIN)
    if (v < (double)INT_MIN || v > (double)INT_MAX) {
      std::ostringstream os;
      os << "label "
         << (label_integral_ && label_leaf_ ? label_leaf_->GetValueLong64(0) : (long long)v)
         << " does not fit a 32-bit integer";
      fail_entry(label_name_, entry, os.str());
    }
    return static_cast<int>(v);
  }

  // ---- an RNTuple's fields -----------------------------------------------------
  void open_ntuple_fields() {
    std::string why;
    strain_nt_.reset(detail::make_ntuple_column(*ntuple_, strain_name_, false, why));
    if (!strain_nt_ && why == "no such branch")
      fail(why, true, strain_name_);
    if (strain_nt_ && strain_nt_->scalar) // the TTree reader's words, whatever the type
      fail("expected a float[N] array or vector<float> per entry, found one number per entry", true,
           strain_name_);
    if (!strain_nt_ || !strain_nt_->is_float) // why: "found <the field's type>"
      fail("expected a float[N] array or vector<float> per entry, " + why, true, strain_name_);
    length_ = strain_nt_->fixed;
    if (!label_name_.empty()) {
      label_nt_.reset(detail::make_ntuple_column(*ntuple_, label_name_, true, why));
      if (!label_nt_)
        fail(why == "no such branch" ? why : "label must be a number per entry", true, label_name_);
      label_integral_ = label_nt_->integral;
    }
    set_offsets(nullptr); // the clusters
  }

  long long ntuple_read(detail::NTupleColumn& c, const std::string& name, long long entry) {
    try {
      return c.read(entry);
    } catch (const ROOT::RException& e) {
      fail_entry(name, entry, "cannot read the entry (" + first_line(e.what()) + ")");
    }
  }

  void copy_ntuple(float* x, int N, long long entry, bool check_finite, int* y) {
    const long long n = ntuple_read(*strain_nt_, strain_name_, entry);
    if (n != N) {
      std::ostringstream os;
      os << "strain has " << n << " elements, expected " << N;
      fail_entry(strain_name_, entry, os.str());
    }
    strain_nt_->copy(x);
    check_strain(x, N, entry, check_finite);
    if (label_nt_) {
      ntuple_read(*label_nt_, label_name_, entry);
      *y = check_label(label_nt_->value(), entry);
    }
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
    if (tree_ && strain_br_) {
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
  std::unique_ptr<detail::NTupleColumn> strain_nt_, label_nt_; // an RNTuple's fields
};

} // namespace data
} // namespace rootclad

#endif // ROOTCLAD_DATA_TREE_SOURCE_H
