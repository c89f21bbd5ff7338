"""Benchmark the readers: shuffled batches of 20,000 x 2048 floats into memory.

    python benchmarks/data/bench_readers.py [--events 20000] [--epochs 3]

For each file (uncompressed, LZ4, ZLIB written by rootclad.gw.simulate
through uproot; ZSTD re-written by ROOT; the uncompressed and LZ4 events re-written by uproot
as RNTuples, ``rntuple_none`` and ``rntuple_lz4``, one cluster per TTree basket) and each reader, one fresh process
reads ``--epochs`` shuffled epochs of batch 256 and reports seconds per
epoch. The first epoch includes warm-up (Cling JIT, first allocations); the
best later epoch is the steady rate. Files are read from the page cache
(they were just written): this measures decoding into memory, not the disk.

Readers: the Python iterator (uproot), the compiled reader through PyROOT
(Cling JIT, -O1), the same header compiled by g++ -O2 (a C++ program), the
root.exe macro, and ROOT's own ``ROOT.Experimental.ML.RDataLoader``.

Writes ``benchmarks/results/data_readers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

READERS = [
    "python_uproot",
    "compiled_pyroot_jit",
    "compiled_gxx_O2",
    "root_macro_jit",
    "rdataloader",
]


# ---- one measurement, in its own process ------------------------------------


def _epochs_of(iterator_factory, epochs: int) -> tuple[float, list[float], int]:
    t0 = time.perf_counter()
    it = iterator_factory()
    setup = time.perf_counter() - t0
    times, entries = [], 0
    for _ in range(epochs):
        t = time.perf_counter()
        entries = 0
        for x, _y in it:
            entries += len(x)
        times.append(time.perf_counter() - t)
    return setup, times, entries


def worker(reader: str, path: str, epochs: int, batch: int) -> dict:
    if reader == "python_uproot":
        from rootclad.data import BatchIterator

        setup, times, entries = _epochs_of(
            lambda: BatchIterator(path, batch_size=batch, seed=1), epochs
        )
        length = BatchIterator(path).length
    elif reader == "compiled_pyroot_jit":
        from rootclad.data import CompiledBatchIterator

        setup, times, entries = _epochs_of(
            lambda: CompiledBatchIterator(path, batch_size=batch, seed=1), epochs
        )
        length = 2048
    elif reader == "rdataloader":
        from rootclad.data.cling import import_root

        root = import_root()

        class _Loader:
            def __init__(self):
                self.df = root.RDataFrame("events", path)
                self.dl = root.Experimental.ML.RDataLoader(
                    self.df, batch_size=batch, columns=["strain", "label"],
                    max_vec_sizes={"strain": 2048}, target="label", shuffle=True,
                    drop_remainder=False, set_seed=1,
                )  # fmt: skip

            def __iter__(self):
                return iter(self.dl.as_numpy())

        setup, times, entries = _epochs_of(_Loader, epochs)
        length = 2048
    else:
        raise ValueError(reader)
    return {"setup_seconds": setup, "epoch_seconds": times, "entries": entries, "length": length}


# ---- subprocess drivers -------------------------------------------------------


def run_worker(reader: str, path: str, epochs: int, batch: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", reader, path, "--epochs", str(epochs),
           "--batch-size", str(batch)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def build_gxx(tmp: Path) -> Path | None:
    if shutil.which("g++") is None:
        return None
    from rootclad.root.flags import root_flags

    exe = tmp / "bench_reader"
    cmd = ["g++", "-O2", str(HERE / "bench_reader.cxx"), *root_flags(), "-o", str(exe)]
    subprocess.run(cmd, check=True)
    return exe


def run_lines(cmd: list[str]) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip
    total = time.perf_counter() - t0
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    rates = [float(m) for m in re.findall(r"MB/s ([0-9.]+)", out.stdout)]
    return {"epoch_MB_per_s": rates, "process_seconds": total}


def summarise(raw: dict, mb: float) -> dict:
    if "error" in raw:
        return raw
    if "epoch_MB_per_s" in raw:
        rates = raw["epoch_MB_per_s"]
    else:
        rates = [mb / t for t in raw["epoch_seconds"]]
    out = {
        "first_epoch_MB_per_s": round(rates[0], 1),
        "steady_MB_per_s": round(max(rates[1:]) if len(rates) > 1 else rates[0], 1),
        "epochs_MB_per_s": [round(r, 1) for r in rates],
    }
    if "setup_seconds" in raw:
        out["setup_seconds"] = round(raw["setup_seconds"], 2)
    if "process_seconds" in raw:
        out["process_seconds"] = round(raw["process_seconds"], 2)
    return out


def make_files(tmp: Path, events: int) -> dict[str, dict]:
    from rootclad.data.cling import import_root
    from rootclad.gw.dataset import simulate

    files = {}
    for comp in ("none", "lz4", "zlib"):
        path = tmp / f"gw_{comp}.root"
        r = simulate(path, events, seed=1, compression=comp, progress=False)
        files[comp] = {"path": str(path), "write_seconds": round(r.seconds, 2)}
    # ZSTD through ROOT (uproot needs the 'zstandard' package to write or read it)
    root = import_root()
    src = root.TFile.Open(files["none"]["path"])
    path = tmp / "gw_zstd.root"
    t0 = time.perf_counter()
    dst = root.TFile(str(path), "RECREATE", "", 505)  # ZSTD level 5, ROOT's default algorithm
    tree = src.Get("events").CloneTree(-1)
    tree.Write()
    dst.Close()
    src.Close()
    files["zstd"] = {"path": str(path), "write_seconds": round(time.perf_counter() - t0, 2),
                     "written_by": "ROOT CloneTree"}  # fmt: skip
    for comp in ("none", "lz4"):
        files[f"rntuple_{comp}"] = _as_rntuple(
            files[comp]["path"], tmp / f"gw_rntuple_{comp}.root", comp
        )
    for info in files.values():
        info["size_MB"] = round(Path(info["path"]).stat().st_size / 1e6, 1)
    return files


def _as_rntuple(src: str, path: Path, comp: str) -> dict:
    """The events of ``src`` written again as the RNTuple "events" (uproot), the strain as
    ``std::array<float, 2048>``, a cluster where the TTree's strain baskets start."""
    import awkward as ak
    import uproot

    t0 = time.perf_counter()
    with uproot.open(src) as f:
        tree = f["events"]
        starts = list(tree["strain"].entry_offsets)
        arrays = tree.arrays(["strain", "label"], library="np")
    table = ak.Array({"strain": arrays["strain"], "label": arrays["label"]})
    compression = uproot.LZ4(1) if comp == "lz4" else None
    with uproot.recreate(path, compression=compression) as f:
        out = f.mkrntuple("events", table.layout.form)
        for lo, hi in zip(starts[:-1], starts[1:], strict=True):
            out.extend(table[lo:hi])
    return {
        "path": str(path),
        "write_seconds": round(time.perf_counter() - t0, 2),
        "written_by": "uproot mkrntuple",
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--worker", nargs=2, metavar=("READER", "FILE"))
    p.add_argument("--events", type=int, default=20000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--readers", nargs="+", default=READERS)
    p.add_argument("--files", nargs="+", default=["none", "lz4", "zlib", "zstd"])
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "data_readers.json"))
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.epochs, args.batch_size)))
        return 0

    import numpy
    import uproot

    conditions = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "uproot": uproot.__version__,
        "events": args.events,
        "length": 2048,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "page_cache": "warm (files just written)",
    }
    results = []
    with tempfile.TemporaryDirectory(dir=REPO / "benchmarks" / "results", prefix="tmp") as tmpdir:
        tmp = Path(tmpdir)
        files = make_files(tmp, args.events)
        conditions["files"] = {
            k: {kk: vv for kk, vv in v.items() if kk != "path"} for k, v in files.items()
        }
        exe = build_gxx(tmp) if "compiled_gxx_O2" in args.readers else None
        mb = args.events * 2048 * 4 / 1e6
        for comp in args.files:
            path = files[comp]["path"]
            for reader in args.readers:
                if reader == "python_uproot" and comp == "zstd":
                    raw = {"error": ["uproot needs the 'zstandard' package for ZSTD"]}
                elif reader == "compiled_gxx_O2":
                    if exe is None:
                        raw = {"error": ["g++ not found"]}
                    else:
                        raw = run_lines([str(exe), str(args.batch_size), str(args.epochs), path])
                elif reader == "root_macro_jit":
                    macro = f'{REPO}/macros/read_gw_batches.C("{path}", {args.batch_size}, {args.epochs}, "all", 0.0, 1)'
                    raw = run_lines(["root", "-b", "-q", "-l", macro])
                else:
                    raw = run_worker(reader, path, args.epochs, args.batch_size)
                rec = {"file": comp, "reader": reader, **summarise(raw, mb)}
                results.append(rec)
                print(json.dumps(rec), flush=True)
    conditions["load_average_after"] = os.getloadavg()
    out = {
        "benchmark": "shuffled batches of 256 into memory",
        "conditions": conditions,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
