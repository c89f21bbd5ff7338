// rootclad/data/ntuple_columns.h — one field of an RNTuple read as numbers per entry, as the
// readers read a TTree's branch (part of rootclad/tree_reader.h, which says how the readers work).
//
// A field is a number (float, double, std::int8_t ... std::uint64_t, bool), an std::array of
// them (read whole into a buffer) or a collection of them (std::vector, ROOT::RVec, whichever
// container wrote it). Anything else is refused with the field's type, in the words of the
// TTree reader's messages.
//
// Floats and doubles move in bulk: a view per item of a collection of 2048 floats, and a
// float-to-float copy loop, were the JIT readers' slowest steps (Cling compiles a macro's loops
// at -O1); a collection of floats or doubles is read as one RVec and floats are copied with
// memcpy.
#ifndef ROOTCLAD_DATA_NTUPLE_COLUMNS_H
#define ROOTCLAD_DATA_NTUPLE_COLUMNS_H

#include <ROOT/RNTupleReader.hxx>
#include <ROOT/RNTupleView.hxx>
#include <ROOT/RVec.hxx>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace rootclad {
namespace data {
namespace detail {

// n values of type T as floats
template <class T> inline void copy_as_float(const T* in, long n, float* out) {
  if constexpr (std::is_same<T, float>::value)
    std::memcpy(out, in, sizeof(float) * (size_t)n);
  else
    for (long i = 0; i < n; ++i)
      out[i] = static_cast<float>(in[i]);
}

struct NTupleColumn {
  virtual ~NTupleColumn() = default;
  virtual long long read(long long entry) = 0;             // reads the entry; its number of values
  virtual void copy(float* out) const = 0;                 // the values read, converted to float
  virtual double value() const = 0;                        // the first value read
  int fixed = -1;                                          // values per entry when fixed, else -1
  bool integral = false, is_float = false, scalar = false; // scalar: a number, not an array
};

template <class T> struct NTupleScalar : NTupleColumn {
  ROOT::RNTupleView<T> view;
  T v{};
  NTupleScalar(ROOT::RNTupleReader& r, const std::string& name) : view(r.GetView<T>(name)) {
    fixed = 1;
    scalar = true;
  }
  long long read(long long entry) override {
    v = view(entry);
    return 1;
  }
  void copy(float* out) const override { out[0] = static_cast<float>(v); }
  double value() const override { return static_cast<double>(v); }
};

// std::array<T, n>: the whole array read into a buffer by a view on the field bound to it
template <class T> struct NTupleArray : NTupleColumn {
  std::unique_ptr<T[]> buf; // not a std::vector: std::vector<bool> has no data()
  std::unique_ptr<ROOT::RNTupleView<void>> view;
  NTupleArray(ROOT::RNTupleReader& r, const std::string& name, const std::string& type, int n)
      : buf(new T[n]()) {
    fixed = n;
    view.reset(new ROOT::RNTupleView<void>(r.GetView(name, (void*)buf.get(), type)));
  }
  long long read(long long entry) override {
    (*view)(entry);
    return fixed;
  }
  void copy(float* out) const override { copy_as_float(buf.get(), fixed, out); }
  double value() const override { return static_cast<double>(buf[0]); }
};

// A collection (std::vector, ROOT::RVec) of floats or doubles: read whole as an RVec
template <class T> struct NTupleCollection : NTupleColumn {
  ROOT::RNTupleView<ROOT::RVec<T>> view;
  const ROOT::RVec<T>* last = nullptr;
  NTupleCollection(ROOT::RNTupleReader& r, const std::string& name)
      : view(r.GetView<ROOT::RVec<T>>(name)) {}
  long long read(long long entry) override {
    last = &view(entry);
    return (long long)last->size();
  }
  void copy(float* out) const override { copy_as_float(last->data(), (long)last->size(), out); }
  double value() const override { return last->empty() ? 0.0 : static_cast<double>((*last)[0]); }
};

// A collection of other numbers: its size per entry, then its items through their own view
// (an RVec of, say, std::int8_t is a template Cling instantiates anew, and it failed to when a
// macro including this header ran again in one root.exe session; ROOT instantiates RVec<float>
// and RVec<double> itself)
template <class T> struct NTupleItems : NTupleColumn {
  ROOT::RNTupleCollectionView coll;
  ROOT::RNTupleView<T> items;
  std::vector<T> buf;
  NTupleItems(ROOT::RNTupleReader& r, const std::string& name, const std::string& item)
      : coll(r.GetCollectionView(name)), items(coll.GetView<T>(item)) {}
  long long read(long long entry) override {
    buf.clear();
    for (auto i : coll.GetCollectionRange(entry))
      buf.push_back(items(i));
    return (long long)buf.size();
  }
  void copy(float* out) const override {
    for (size_t i = 0; i < buf.size(); ++i)
      out[i] = static_cast<float>(buf[i]);
  }
  double value() const override { return buf.empty() ? 0.0 : static_cast<double>(buf[0]); }
};

template <class T>
NTupleColumn* ntuple_column_as(ROOT::RNTupleReader& r, const std::string& name, int kind,
                               const std::string& type, int n, const std::string& item) {
  if (kind == 0)
    return new NTupleScalar<T>(r, name);
  if (kind == 1)
    return new NTupleArray<T>(r, name, type, n);
  if constexpr (std::is_same<T, float>::value || std::is_same<T, double>::value)
    return new NTupleCollection<T>(r, name);
  else
    return new NTupleItems<T>(r, name, item);
}

// The column for the number type `leaf` (a field's type name): `kind` 0 a number, 1 an array
// of n (`type` the array's type name), 2 a collection (`item`: its items' field). Null for
// a type that is not a number.
inline NTupleColumn* ntuple_column_of(ROOT::RNTupleReader& r, const std::string& name,
                                      const std::string& leaf, int kind, const std::string& type,
                                      int n, const std::string& item) {
  NTupleColumn* c = nullptr;
  // no generic lambda: Cling crashed running a macro with one again (root.exe's second .x)
  if (leaf == "float")
    c = ntuple_column_as<float>(r, name, kind, type, n, item);
  else if (leaf == "double")
    c = ntuple_column_as<double>(r, name, kind, type, n, item);
  else if (leaf == "std::int8_t")
    c = ntuple_column_as<std::int8_t>(r, name, kind, type, n, item);
  else if (leaf == "std::uint8_t")
    c = ntuple_column_as<std::uint8_t>(r, name, kind, type, n, item);
  else if (leaf == "std::int16_t")
    c = ntuple_column_as<std::int16_t>(r, name, kind, type, n, item);
  else if (leaf == "std::uint16_t")
    c = ntuple_column_as<std::uint16_t>(r, name, kind, type, n, item);
  else if (leaf == "std::int32_t")
    c = ntuple_column_as<std::int32_t>(r, name, kind, type, n, item);
  else if (leaf == "std::uint32_t")
    c = ntuple_column_as<std::uint32_t>(r, name, kind, type, n, item);
  else if (leaf == "std::int64_t")
    c = ntuple_column_as<std::int64_t>(r, name, kind, type, n, item);
  else if (leaf == "std::uint64_t")
    c = ntuple_column_as<std::uint64_t>(r, name, kind, type, n, item);
  else if (leaf == "bool")
    c = ntuple_column_as<bool>(r, name, kind, type, n, item);
  else if (leaf == "char")
    c = ntuple_column_as<char>(r, name, kind, type, n, item);
  else
    return nullptr;
  c->integral = leaf != "float" && leaf != "double";
  c->is_float = leaf == "float";
  return c;
}

inline NTupleColumn* make_ntuple_column_or_throw(ROOT::RNTupleReader& r, const std::string& name,
                                                 bool scalar, std::string& why) {
  const ROOT::RNTupleDescriptor& d = r.GetDescriptor();
  const auto id = d.FindFieldId(name);
  if (id == ROOT::kInvalidDescriptorId) {
    why = "no such branch";
    return nullptr;
  }
  const ROOT::RFieldDescriptor& f = d.GetFieldDescriptor(id);
  const std::string type = f.GetTypeName();
  why = "found " + type;
  const auto& links = f.GetLinkIds();
  if (links.empty()) // a number
    return f.GetNRepetitions() ? nullptr : ntuple_column_of(r, name, type, 0, type, 1, "");
  if (scalar || links.size() != 1)
    return nullptr;
  const ROOT::RFieldDescriptor& item = d.GetFieldDescriptor(links[0]);
  if (!item.GetLinkIds().empty())
    return nullptr; // arrays of arrays, collections of records...
  if (f.GetNRepetitions() > 0 && f.GetStructure() == ROOT::ENTupleStructure::kPlain)
    return ntuple_column_of(r, name, item.GetTypeName(), 1, type, (int)f.GetNRepetitions(), "");
  if (f.GetStructure() == ROOT::ENTupleStructure::kCollection)
    return ntuple_column_of(r, name, item.GetTypeName(), 2, type, 0, item.GetFieldName());
  return nullptr;
}

// The field `name` of `r` as numbers per entry; `scalar`: one number per entry. On a field of
// another kind, `why` says what it holds ("found <type>") and the result is null; a field
// ROOT cannot read gives null and "cannot read the field (<ROOT's message>)".
inline NTupleColumn* make_ntuple_column(ROOT::RNTupleReader& r, const std::string& name,
                                        bool scalar, std::string& why) {
  try {
    return make_ntuple_column_or_throw(r, name, scalar, why);
  } catch (const ROOT::RException& e) {
    const std::string what = e.what();
    why = "cannot read the field (" + what.substr(0, what.find('\n')) + ")";
    return nullptr;
  }
}

} // namespace detail
} // namespace data
} // namespace rootclad

#endif // ROOTCLAD_DATA_NTUPLE_COLUMNS_H
