"""``rootclad emit``: a model as one standalone C++ header plus a weights file.

The header holds everything: rootclad's runtime headers inlined (kernels, pullbacks, threads;
BLAS optional: plain loops unless ``ROOTCLAD_USE_CBLAS`` is defined and a CBLAS is linked),
the model's generated forward and reverse sweep (the pullback engine's, without the C API of a
library), and in ``namespace NAME``:

- ``Session``: reads the weights file once, keeps its working memory (grown to the largest
  batch seen, never per call), ``infer(x, out, B)``, ``infer_pullback(x, d_out, d_x, B)``
  (adds J^T d_out to d_x, and the parameters' gradient to ``grad()``);
- ``infer(Net{&session}, x, out, B)``, a free function whose Clad-convention pullback is
  declared in ``clad::custom_derivatives::NAME``: a user's function that calls ``NAME::infer``
  can be differentiated by Clad, which then calls the network's own backward (``Net`` holds
  the session's address: Clad makes a zeroed adjoint of each argument, which a Session, owning
  memory, cannot be).

g++ alone compiles it (``-std=c++17``); so does Cling (``#include`` in a ROOT macro).
The weights file: the 8 bytes ``RCLADW01``, the element size (uint32), 4 bytes reserved, the
value count (uint64), the model's prefix (uint32 length, then its characters), the values.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import numpy as np
import torch

from rootclad.codegen.cpu import emit_model
from rootclad.codegen.cxx import KEYWORDS, comment_text
from rootclad.paths import get_include

MAGIC = b"RCLADW01"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"(?:rootclad/)?([\w./]+\.h)"')


def amalgamate(source: str, include_dir: Path) -> str:
    """``source`` with every rootclad header it includes inlined once, in include order. The
    generated source names them ``rootclad/<name>``; the headers name each other relative to
    their own directory (``kernels.h``, ``ops/activations.h``, ``../hd.h``)."""
    seen: set[Path] = set()
    root = include_dir.resolve()

    def expand(text: str, here: Path) -> str:
        out = []
        for line in text.splitlines():
            m = _INCLUDE.match(line)
            path = None
            if m:
                for base in (here, root):
                    candidate = (base / m.group(1)).resolve()
                    if candidate.is_file() and candidate.is_relative_to(root):
                        path = candidate
                        break
            if path is None:
                out.append(line)
                continue
            if path not in seen:
                seen.add(path)
                body = re.sub(r"^\s*#\s*pragma\s+once\s*$", "", path.read_text(), flags=re.M)
                name = path.relative_to(root).as_posix()
                out += [f"// ---- rootclad/{name} ----", expand(body, path.parent)]
        return "\n".join(out)

    return expand(source, root)


def _session(name: str, prefix: str, em, graph) -> str:
    inp, out = em.input_region, em.output_region
    P = prefix
    return f"""
namespace {name} {{
using T = ::{P}::Model::T;
constexpr long INPUT_SIZE = {inp.size};   // per sample: {tuple(graph.input_shape)}
constexpr long OUTPUT_SIZE = {out.size};  // per sample: {tuple(graph.output_shape)}
constexpr long N_VALUES = ::{P}::Model::N_PARAMS + ::{P}::Model::N_BUFFERS;
constexpr auto DESC = ::rootclad::model_desc<::{P}::Model>();

// The network with its weights, and the working memory of the largest batch seen so far.
class Session {{
 public:
  explicit Session(const std::string& weights, int max_batch = 1) {{
    std::ifstream f(weights, std::ios::binary);
    if (!f)
      throw std::runtime_error("{name}: cannot open the weights file " + weights);
    char magic[8];
    std::uint32_t size = 0, reserved = 0, len = 0;
    std::uint64_t count = 0;
    f.read(magic, 8);
    f.read(reinterpret_cast<char*>(&size), 4);
    f.read(reinterpret_cast<char*>(&reserved), 4);
    f.read(reinterpret_cast<char*>(&count), 8);
    f.read(reinterpret_cast<char*>(&len), 4);
    std::string prefix(len < 256 ? len : 0, ' ');
    f.read(&prefix[0], (std::streamsize)prefix.size());
    if (!f || std::string(magic, 8) != "RCLADW01")
      throw std::runtime_error("{name}: " + weights + " is not a rootclad weights file");
    if (prefix != "{P}" || size != sizeof(T) || count != (std::uint64_t)N_VALUES)
      throw std::runtime_error("{name}: " + weights + " holds the weights of another model (" +
                               prefix + "), not of this header's ({P})");
    params_.resize(N_VALUES);
    f.read(reinterpret_cast<char*>(params_.data()), (std::streamsize)(N_VALUES * sizeof(T)));
    if (!f)
      throw std::runtime_error("{name}: " + weights + " ends before its " +
                               std::to_string(N_VALUES) + " values");
    grad_.assign(N_VALUES, T(0));
    reserve(max_batch);
  }}

  // out (B x OUTPUT_SIZE) = the network on x (B x INPUT_SIZE), in inference mode.
  void infer(const T* x, T* out, int B) {{
    forward(x, B);
    const T* o = act_.data() + (long)B * {out.offset};
    std::copy(o, o + (long)B * OUTPUT_SIZE, out);
  }}

  // d_x += J^T d_out, and grad() += the parameters' share, for the network at x.
  void infer_pullback(const T* x, const T* d_out, T* d_x, int B) {{
    forward(x, B);
    ::rootclad::model_vjp_chunk(DESC, params_.data(), act_.data(), grad_.data(), d_act_.data(),
                                d_out, B, 0, B, 0, SEED, 1);
    const T* d = d_act_.data() + (long)B * {inp.d_offset};
    for (long i = 0; i < (long)B * INPUT_SIZE; ++i)
      d_x[i] += d[i];
  }}

  T* params() {{ return params_.data(); }}
  T* grad() {{ return grad_.data(); }} // the parameters' gradient, added to by infer_pullback
  void zero_grad() {{ std::fill(grad_.begin(), grad_.end(), T(0)); }}
  static constexpr long n_params() {{ return ::{P}::Model::N_PARAMS; }}

 private:
  static constexpr std::uint64_t SEED = 0;
  void reserve(int B) {{
    if (B < 1)
      throw std::invalid_argument("{name}: batch size must be at least 1");
    if (B <= batch_)
      return;
    act_.resize((size_t)B * ::{P}::Model::ACT_PER_SAMPLE);
    d_act_.resize((size_t)B * ::{P}::Model::D_ACT_PER_SAMPLE);
    batch_ = B;
  }}
  void forward(const T* x, int B) {{
    reserve(B);
    std::copy(x, x + (long)B * INPUT_SIZE, act_.data() + (long)B * {inp.offset});
    ::{P}::Model::forward_chunk(params_.data(), act_.data(), B, 0, B, 0, SEED);
  }}
  std::vector<T> params_, grad_, act_, d_act_;
  int batch_ = 0;
}};

// The network as a function, for Clad (its pullback is below): it takes the session through
// a Net, a plain pointer holder, since Clad makes a zeroed adjoint of every argument.
struct Net {{
  Session* session;
}};
inline void infer(Net net, const T* x, T* out, int B) {{ net.session->infer(x, out, B); }}
}} // namespace {name}

namespace clad {{
namespace custom_derivatives {{
namespace {name} {{
// Clad's convention: the primal arguments, then one adjoint per argument. out is written by
// infer, so its adjoint is consumed (zeroed) here, as Clad does for an assignment.
inline void infer_pullback(::{name}::Net net, const ::{name}::T* x, ::{name}::T* out, int B,
                           ::{name}::Net* d_net, ::{name}::T* d_x, ::{name}::T* d_out, int* d_B) {{
  net.session->infer_pullback(x, d_out, d_x, B);
  for (long i = 0; i < (long)B * ::{name}::OUTPUT_SIZE; ++i)
    d_out[i] = 0;
}}
}} // namespace {name}
}} // namespace custom_derivatives
}} // namespace clad
"""


def write_header(graph, state: dict, out: Path, name: str | None = None) -> dict:
    """Write ``out`` (the header) and ``out`` with suffix ``.dat`` (the weights) for the
    validated ``graph`` with the values ``state`` (parameters and buffers by name); returns
    their paths. ``name`` (default: the header's stem) is the C++ namespace."""
    out = Path(out)
    name = name or re.sub(r"[^A-Za-z0-9_]", "_", out.stem)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"{name!r} is not a C++ identifier; give --name")
    if name in KEYWORDS or name in ("std", "clad", "rootclad"):
        raise ValueError(f"{name!r} is a C++ keyword or a namespace the header uses; give --name")
    em = emit_model(graph, "mse", "pullback", True, c_api=False)
    prefix = em.prefix
    # the runtime's definitions too: one header, no library (ops/core.h's thread-locals inline)
    body = amalgamate(
        em.source + '#include "rootclad/model_runtime_impl.h"\n', Path(get_include()) / "rootclad"
    )
    guard = f"ROOTCLAD_EMIT_{name.upper()}_HXX"
    text = "\n".join([
        f"// {comment_text(out.name)}: generated by `rootclad emit` for {name}; a standalone "
        "header.",
        f"// Weights: {comment_text(out.with_suffix('.dat').name)}. Compile with g++ -std=c++17 "
        "(-O2 -march=native);",
        "// define ROOTCLAD_USE_CBLAS and link a CBLAS to use it for the matrix products.",
        f"#ifndef {guard}",
        f"#define {guard}",
        "#define ROOTCLAD_STANDALONE",
        "#ifndef ROOTCLAD_USE_CBLAS",
        "#define ROOTCLAD_NO_BLAS",
        "#endif",
        "#include <algorithm>",
        "#include <cstdint>",
        "#include <fstream>",
        "#include <stdexcept>",
        "#include <string>",
        "#include <vector>",
        body,
        _session(name, prefix, em, graph),
        f"#endif // {guard}",
        "",
    ])  # fmt: skip
    values = [state[p.name].detach().reshape(-1) for p in graph.params + graph.buffers]
    dtype = {"float32": torch.float32, "float64": torch.float64}[graph.dtype]
    flat = torch.cat(values).to(dtype).numpy() if values else np.zeros(0)
    elem = 4 if dtype == torch.float32 else 8
    head = MAGIC + struct.pack("<IIQI", elem, 0, flat.size, len(prefix)) + prefix.encode()
    weights = out.with_suffix(".dat")
    out.parent.mkdir(parents=True, exist_ok=True)
    files = {out: text.encode(), weights: head + flat.astype(f"<f{elem}").tobytes()}
    tmp = {path: path.with_name(f".{path.name}.{os.getpid()}.partial") for path in files}
    try:  # both written before either replaces its old file: a header never meets old weights
        for path, data in files.items():
            tmp[path].write_bytes(data)
        for path in files:
            os.replace(tmp[path], path)
    finally:  # a full disk, Ctrl-C: no partial file left
        for t in tmp.values():
            t.unlink(missing_ok=True)
    return {"header": out, "weights": weights}
