// rootclad/data/rdf_stream.h — rows of an RDataFrame, its filters and defines applied, read a
// range of its source's entries at a time into float32 rows: what rootclad.data.from_rdataframe
// (stream=True) streams training batches from, with no copy of the data to a file.
//
// One event loop per block: the loop's entry range is moved to the block's source entries
// (ROOT::Internal::RDF::ChangeBeginAndEndEntries, as ROOT's own RDataLoader does), each column
// is taken (a typed Take, so no JIT per block), and the rows are flattened into the caller's
// arrays in entry order (rdfentry_). Single-threaded loops only: with ImplicitMT, rdfentry_ of
// a TTree's loop counts entries in the order threads take them, not the entry numbers
// (rootclad.data.rdf_stream refuses to stream then).
#ifndef ROOTCLAD_DATA_RDF_STREAM_H
#define ROOTCLAD_DATA_RDF_STREAM_H

#include <ROOT/RDataFrame.hxx>
#include <ROOT/RVec.hxx>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace rootclad {
namespace data {

// One column's values over a block: booked lazily, read after the loop
struct RDFColumn {
  virtual ~RDFColumn() = default;
  virtual void book(ROOT::RDF::RNode& node, const std::string& name) = 0;
  virtual void fetch() = 0; // after the loop: the values taken
  virtual void release() = 0;
  // Values of row `row` into out (at most `width`); the row's length (-1: not a number)
  virtual long copy(std::size_t row, float* out, long width) const = 0;
  virtual double value(std::size_t row) const = 0; // the first value (targets, weights)
};

template <class T> struct RDFScalarColumn : RDFColumn {
  ROOT::RDF::RResultPtr<std::vector<T>> taken;
  const std::vector<T>* values = nullptr;
  void book(ROOT::RDF::RNode& node, const std::string& name) override {
    taken = node.Take<T>(name);
  }
  void fetch() override { values = taken.GetPtr(); }
  void release() override { taken = {}, values = nullptr; }
  long copy(std::size_t row, float* out, long width) const override {
    if (width >= 1)
      out[0] = static_cast<float>((*values)[row]);
    return 1;
  }
  double value(std::size_t row) const override { return static_cast<double>((*values)[row]); }
};

// RVec<T>, std::vector<T>, std::array<T, n>: a number per item
template <class C> struct RDFArrayColumn : RDFColumn {
  ROOT::RDF::RResultPtr<std::vector<C>> taken;
  const std::vector<C>* values = nullptr;
  void book(ROOT::RDF::RNode& node, const std::string& name) override {
    taken = node.Take<C>(name);
  }
  void fetch() override { values = taken.GetPtr(); }
  void release() override { taken = {}, values = nullptr; }
  long copy(std::size_t row, float* out, long width) const override {
    const C& v = (*values)[row];
    const long n = (long)v.size();
    if (n == width) {
      using T = typename C::value_type;
      if constexpr (std::is_same<T, float>::value)
        std::copy(v.begin(), v.end(), out);
      else
        for (long i = 0; i < n; ++i)
          out[i] = static_cast<float>(v[i]);
    }
    return n;
  }
  double value(std::size_t row) const override {
    const C& v = (*values)[row];
    return v.size() ? static_cast<double>(v[0]) : 0.0;
  }
};

struct RDFBlock {
  std::vector<ULong64_t> entries;                     // rdfentry_ of each row, in entry order
  std::vector<long> first_lengths;                    // each feature's length in the first row
  long bad_row = -1, bad_column = -1, bad_length = 0; // a feature of another length
};

struct RDFFirstPass {
  std::vector<ULong64_t> accepted;       // the entries the filters pass, in order
  std::vector<ULong64_t> cluster_starts; // the first entry of each cluster of the dataset
  ULong64_t source_entries = 0;          // all of the source's entries
};

// One event loop: the entries `node`'s filters pass, and the count of its source's entries
// (its loop's full range, which read_rdf_block restores after each block)
inline RDFFirstPass rdf_first_pass(ROOT::RDF::RNode node) {
  RDFFirstPass out;
  // the dataset's clusters, as ROOT's RDataLoader finds them (a source that has none, neither
  // a TTree nor an RNTuple, throws here, before any loop): the last one ends with the source
  const auto clusters = ROOT::Internal::RDF::GetDatasetGlobalClusterBoundaries(node);
  out.source_entries = clusters.empty() ? 0 : clusters.back().second;
  for (const auto& c : clusters)
    out.cluster_starts.push_back(c.first);
  auto taken = node.Take<ULong64_t>("rdfentry_");
  out.accepted = *taken;
  std::sort(out.accepted.begin(), out.accepted.end());
  return out;
}

// The rows of `node` among its source's entries [begin, end): `columns` (named `names`) taken
// in one event loop, then, when there are `rows` of them (the caller's x, y, w), the features
// (the first `widths.size()` columns, flattened, `widths` values each) into x (rows x
// sum(widths)), the next column (the target) into y and the one after (the weight, if any)
// into w. A feature of another length stops the filling at that row (bad_*). The loop's range
// is restored to [0, source_entries) whatever happens, so the user's RDataFrame runs over all
// its entries again.
inline RDFBlock read_rdf_block(ROOT::RDF::RNode node, Long64_t begin, Long64_t end,
                               Long64_t source_entries, const std::vector<RDFColumn*>& columns,
                               const std::vector<std::string>& names,
                               const std::vector<long>& widths, float* x, double* y, float* w,
                               long rows) {
  RDFBlock out;
  struct Restore {
    ROOT::RDF::RNode& n;
    Long64_t all;
    ~Restore() { ROOT::Internal::RDF::ChangeBeginAndEndEntries(n, 0, all); }
  } restore{node, source_entries};
  ROOT::Internal::RDF::ChangeBeginAndEndEntries(node, begin, end);
  auto entries = node.Take<ULong64_t>("rdfentry_");
  for (std::size_t c = 0; c < columns.size(); ++c)
    columns[c]->book(node, names[c]);
  const std::vector<ULong64_t>& taken = *entries; // runs the loop
  for (RDFColumn* c : columns)
    c->fetch();
  std::vector<std::size_t> order(taken.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::sort(order.begin(), order.end(),
            [&taken](std::size_t a, std::size_t b) { return taken[a] < taken[b]; });
  out.entries.resize(taken.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    out.entries[i] = taken[order[i]];
  if (!order.empty())
    for (std::size_t c = 0; c < widths.size(); ++c)
      out.first_lengths.push_back(columns[c]->copy(order[0], nullptr, -1));
  if ((long)order.size() == rows) {
    const std::size_t nf = widths.size();
    const long stride = std::accumulate(widths.begin(), widths.end(), 0L);
    for (long i = 0; i < rows && out.bad_row < 0; ++i) {
      float* row = x + i * stride;
      for (std::size_t c = 0; c < nf; ++c) {
        const long n = columns[c]->copy(order[i], row, widths[c]);
        if (n != widths[c]) {
          out.bad_row = i, out.bad_column = (long)c, out.bad_length = n;
          break;
        }
        row += widths[c];
      }
      y[i] = columns[nf]->value(order[i]);
      if (w)
        w[i] = static_cast<float>(columns[nf + 1]->value(order[i]));
    }
  }
  for (RDFColumn* c : columns)
    c->release();
  return out;
}

} // namespace data
} // namespace rootclad

#endif // ROOTCLAD_DATA_RDF_STREAM_H
