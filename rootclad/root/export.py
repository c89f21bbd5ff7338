"""``cm.export(stem)``: the files a ROOT user needs, written without ROOT.

``STEM.so`` is the compiled library; ``STEM.root`` holds every parameter as a TTree named like
the torch parameter, with one entry of a ``values[n]/D`` branch and the shape in its title, and
a TObjString ``rootclad_metadata`` (JSON); ``STEM.h`` is rootclad's C++ host in one file. Each
file is written to a temporary name first and renamed once all three are written; the weights name
the library's MD5, so ``rootclad::Model`` never pairs weights with a library they were not
exported with.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np

from rootclad.codegen.cxx import comment_text
from rootclad.codegen.standalone import amalgamate
from rootclad.paths import get_include
from rootclad.toolchain.build import file_digest
from rootclad.version import __version__

_CALLS = itertools.count(1)


def header(cm, file_name: str, stem_name: str) -> str:
    """``STEM.h``: rootclad's C++ host (``rootclad/model.h`` and the headers it includes: the
    Model, score_tree, SlotModels, the TTree readers; inlined once, their include guards kept) in one file that needs only ROOT. It names no
    path: moved with ``STEM.so`` and ``STEM.root`` to another directory or machine, it works
    with ``.x``, ACLiC and g++ alike; a program that also includes rootclad's own headers
    compiles each of them once (include guards, not ``#pragma once``, which Cling forgets
    when it unloads a macro that ran before)."""
    guard = f"ROOTCLAD_EXPORT_{cm._em.prefix.upper()}_H"
    body = amalgamate('#include "rootclad/model.h"\n', Path(get_include()) / "rootclad")
    return (
        f"// {comment_text(file_name)}: the rootclad model exported as {comment_text(stem_name)} "
        f"({cm._em.prefix}), rootclad {__version__}.\n"
        "// Self-contained: rootclad's C++ host, needing only ROOT (no include path, no\n"
        "// rootclad install). In a macro, R__LOAD_LIBRARY(<stem>.so) is not needed:\n"
        '//   rootclad::Model m("<stem>");  // opens <stem>.so and <stem>.root\n'
        f"#ifndef {guard}\n#define {guard}\n{body}\n#endif // {guard}\n"
    )


_HEADERS_ID = re.compile(r"(ROOTCLAD_HEADERS_ID(?: \+ 0 !=)? )0x[0-9a-f]+")


def headers_id(body: str | None = None) -> str:
    """The fingerprint of rootclad's C++ host (``model.h`` and what it includes, as ``STEM.h``
    inlines them), which ``model.h`` states as ``ROOTCLAD_HEADERS_ID``: a program including an
    exported ``STEM.h`` and rootclad's headers of another version stops with an #error there
    (their include guards would otherwise keep the first one's definitions). The value in
    ``model.h`` is kept equal to this by tests/root/test_root_schema.py."""
    if body is None:
        body = amalgamate('#include "rootclad/model.h"\n', Path(get_include()) / "rootclad")
    normal = _HEADERS_ID.sub(r"\g<1>0x0", body)
    return "0x" + hashlib.sha256(normal.encode()).hexdigest()[:7]


def metadata(cm, library_md5: str, schema=None) -> dict:
    """What ``STEM.root`` says about the model (``rootclad::Model`` reads prefix and MD5, the
    frozen parameters, which its training leaves unchanged, and the schema's fields)."""
    return {
        "prefix": cm._em.prefix,
        "library_md5": library_md5,
        "dtype": str(cm.dtype).removeprefix("torch."),
        "loss": cm.loss,
        "engine": cm.engine,
        "pullbacks": cm.pullbacks,
        "input_shape": list(cm.input_shape),
        "output_shape": list(cm.output_shape),
        # a model with several outputs: its output row is theirs, concatenated in this order
        **(
            {
                "outputs": [{"key": k, "shape": list(s)} for k, s in cm.output_parts],
                "loss_output": cm.graph.loss_part,
            }
            if cm.output_parts
            else {}
        ),
        "parameters": [{"name": n, "shape": list(p.shape)} for n, p in cm.named_parameters()],
        "frozen": [n for n, p in cm.named_parameters() if not p.requires_grad],
        "rootclad_version": __version__,
        "seed": cm._seed,
        **(schema.to_json() if schema is not None else {}),
        "preprocess": [_stage(cm, name) for name in cm._stages],
    }


def _stage(cm, module: str) -> dict:
    """A rootclad.data.Standardize in the model: where it is and its constants (its frozen
    ``mean`` and ``std``, also stored as parameters)."""
    params = dict(cm.named_parameters())
    key = f"{module}." if module else ""
    mean, std = (params[key + k].detach().double().flatten().tolist() for k in ("mean", "std"))
    return {"stage": "standardize", "module": module, "mean": mean, "std": std}


def _schema(cm, schema):
    from rootclad.data.schema import Schema, check_schema

    if schema is None:
        return None
    from rootclad.ir.graph import CLASS_INDEX_LOSSES

    return check_schema(
        Schema.of(schema),
        math.prod(cm.input_shape),
        "cm.export(schema=...)",
        outputs=math.prod(cm.output_shape),
        class_index=cm.loss in CLASS_INDEX_LOSSES,
    )


def _optimizer_tree(f, cm, opt) -> None:
    """``rootclad_optimizer`` as ``rootclad::Model::save(path, &opt)`` writes it."""
    if opt.model is not cm:
        raise ValueError("this optimizer was created for another compiled model")
    # tensors frozen now are exported frozen (rootclad::Model gives them step 0): their count
    # does not matter; the others must share one, which rootclad::Model keeps
    frozen = [not p.requires_grad for _, p in cm.named_parameters()]
    if opt._steps is None:
        steps = {opt.step_count}
    else:
        steps = {n for n, f in zip(opt._steps, frozen, strict=True) if not f} or {0}
    if len(steps) != 1:
        raise ValueError(
            "the optimizer's trainable parameters have taken different numbers of steps (some "
            "were frozen for a while); rootclad::Model keeps one step count and cannot resume it"
        )
    P = cm._em.n_params
    config = np.frombuffer(opt._cfg, dtype=np.float64).reshape(1, -1)
    tree = f.mktree(
        "rootclad_optimizer",
        {
            "config": np.dtype((np.float64, (config.shape[1],))),
            "step": np.int64,
            "state": np.dtype((np.float64, (2 * P,))),
        },
        title="rootclad optimizer: hyperparameters, step, state",
    )
    state = opt._state[: 2 * P].double().reshape(1, -1).numpy()
    tree.extend({"config": config, "step": np.array([steps.pop()], np.int64), "state": state})


def export(cm, stem, optimizer=None, schema=None) -> dict[str, Path]:
    """Write ``STEM.so``, ``STEM.root`` and ``STEM.h`` for ``cm``; returns their paths.

    With ``optimizer`` (a rootclad optimizer of ``cm``), ``STEM.root`` also holds its
    hyperparameters, step count and state, which ``rootclad::Model::load(path, &opt)``
    restores: training resumes in C++ where Python left it. With ``schema``
    (:class:`rootclad.data.Schema` or a reader), the metadata holds the input columns, their
    lengths, the target, weight and class names (checked against the model's input size)."""
    import uproot

    if len(cm.input_shapes) != 1:
        raise ValueError(
            f"this model takes {len(cm.input_shapes)} inputs; the ROOT artifact is for "
            "single-input models (rootclad::Model, macros and RDataFrame feed one input)"
        )
    if cm.output_parts:
        raise ValueError(
            f"this model returns a {cm.graph.container} of {len(cm.output_parts)} tensors; the "
            "ROOT artifact is for single-output models (rootclad::Model, its loss and targets, "
            "macros and RDataFrame read one output): torch.cat them in the model, or use it "
            "from Python"
        )
    if cm._em.n_buffers:
        raise ValueError(
            "this model keeps buffers (BatchNorm's running statistics, a buffer read directly "
            "such as a position encoding), which the ROOT artifact does not store yet; use it "
            "from Python"
        )
    schema = _schema(cm, schema)
    stem = Path(stem)
    if not stem.parent.is_dir():
        raise FileNotFoundError(f"{stem.parent}: no such directory (create it first)")
    paths = {k: stem.with_name(stem.name + k) for k in (".so", ".root", ".h")}
    # unique per call, so that two exports to one stem never write each other's files
    unique = f"{os.getpid()}.{next(_CALLS)}"
    tmp = {k: p.with_name(f".{p.name}.{unique}.partial") for k, p in paths.items()}
    writing = ".so"
    try:
        shutil.copyfile(cm.self_contained_library(), tmp[".so"])
        writing = ".root"
        md5 = file_digest(tmp[".so"], "md5")  # ROOT's TMD5 checks it in rootclad::Model
        with uproot.recreate(tmp[".root"]) as f:
            for name, p in cm.named_parameters():
                values = p.detach().to(dtype=p.dtype).double().reshape(1, -1).numpy()
                tree = f.mktree(
                    name,
                    {"values": np.dtype((np.float64, (values.shape[1],)))},
                    title=f"rootclad parameter, shape {tuple(p.shape)}",
                )
                tree.extend({"values": values})
            if optimizer is not None:
                _optimizer_tree(f, cm, optimizer)
            f["rootclad_metadata"] = json.dumps(metadata(cm, md5, schema))
        writing = ".h"
        tmp[".h"].write_text(header(cm, paths[".h"].name, stem.name))
        for ext in (".so", ".root", ".h"):  # all written: now each replaces its old file
            writing = ext
            os.replace(tmp[ext], paths[ext])
    except OSError as err:
        # name the export's file, not the cache's library being copied or a temporary name
        if err.errno is None:
            raise OSError(f"{paths[writing]}: {err}") from err
        raise OSError(err.errno, err.strerror, str(paths[writing])) from err
    finally:
        for t in tmp.values():
            t.unlink(missing_ok=True)
    return paths
