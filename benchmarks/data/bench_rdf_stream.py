"""Benchmark training batches from a filtered RDataFrame: streamed, through a snapshot, and
ROOT's own RDataLoader, on the same data.

    python benchmarks/data/bench_rdf_stream.py [--events 1000000] [--epochs 3]

A TTree of ``--events`` entries (16 float32 columns, an int label) written by uproot; the
RDataFrame ``RDataFrame("t", file).Filter("f0 > -1").Define("f16", "f0 * f1")`` (84% pass);
features f1..f16, target label, shuffled batches of 256. Each reader runs in a fresh process:
``stream`` (``from_rdataframe(df, stream=True)``: the event loop block by block),
``snapshot`` (``from_rdataframe(df)``: the columns written once to a temporary file, then read
by uproot) and ``rdataloader`` (``ROOT.Experimental.ML.RDataLoader``). Setup is the
construction (the stream's first pass, the snapshot, RDataLoader's set-up); an epoch's time
is the loop over all batches. Writes ``benchmarks/results/data_rdf_stream.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

READERS = ["stream", "snapshot", "rdataloader"]
FEATURES = [f"f{i}" for i in range(1, 17)]


def make_file(path: Path, events: int) -> None:
    import numpy as np
    import uproot

    rng = np.random.default_rng(0)
    cols = {f"f{i}": rng.normal(size=events).astype(np.float32) for i in range(16)}
    cols["label"] = (rng.random(events) < 0.5).astype(np.int32)
    with uproot.recreate(path) as f:
        f.mktree("t", {k: v.dtype for k, v in cols.items()})
        step = 100_000
        for lo in range(0, events, step):
            f["t"].extend({k: v[lo : lo + step] for k, v in cols.items()})


def worker(reader: str, path: str, epochs: int, batch: int) -> dict:
    from rootclad.data.cling import import_root

    root = import_root()
    df = root.RDataFrame("t", path).Filter("f0 > -1").Define("f16", "f0 * f1")
    t0 = time.perf_counter()
    if reader in ("stream", "snapshot"):
        from rootclad.data import from_rdataframe

        it = from_rdataframe(
            df,
            features=FEATURES,
            target="label",
            batch_size=batch,
            seed=1,
            stream=reader == "stream",
        )

        def batches():
            return iter(it)

    else:
        dl = root.Experimental.ML.RDataLoader(
            df,
            batch_size=batch,
            columns=[*FEATURES, "label"],
            target="label",
            shuffle=True,
            drop_remainder=False,
            set_seed=1,
        )

        def batches():
            return iter(dl.as_numpy())

    setup = time.perf_counter() - t0
    times, rows = [], 0
    for _ in range(epochs):
        t = time.perf_counter()
        rows = sum(len(x) for x, *_ in batches())
        times.append(time.perf_counter() - t)
    return {
        "setup_seconds": round(setup, 3),
        "epoch_seconds": [round(t, 3) for t in times],
        "rows": rows,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", nargs=2, metavar=("READER", "FILE"))
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--readers", nargs="+", default=READERS)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "data_rdf_stream.json"))
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker, args.epochs, args.batch_size)))
        return 0
    conditions = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "events": args.events,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "dataframe": 'RDataFrame("t", file).Filter("f0 > -1").Define("f16", "f0 * f1")',
        "features": FEATURES,
    }
    results = []
    with tempfile.TemporaryDirectory(prefix="rootclad-bench-") as tmp:
        path = Path(tmp) / "table.root"
        make_file(path, args.events)
        for reader in args.readers:
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                reader,
                str(path),
                "--epochs",
                str(args.epochs),
                "--batch-size",
                str(args.batch_size),
            ]
            run = subprocess.run(cmd, capture_output=True, text=True)
            lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
            rec = json.loads(lines[-1]) if lines else {"error": run.stderr[-2000:]}
            if "epoch_seconds" in rec:
                best = min(rec["epoch_seconds"][1:] or rec["epoch_seconds"])
                rec["steady_rows_per_s"] = round(rec["rows"] / best)
                rec["first_epoch_rows_per_s"] = round(rec["rows"] / rec["epoch_seconds"][0])
            rec = {"reader": reader, **rec}
            results.append(rec)
            print(json.dumps(rec), flush=True)
    conditions["load_average_after"] = os.getloadavg()
    out = {
        "benchmark": "shuffled batches of 256 from a filtered RDataFrame",
        "conditions": conditions,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
