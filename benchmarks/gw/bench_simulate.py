"""Benchmark ``rootclad.gw.simulate``: events per second for 1 s segments at 2048 Hz.

    python benchmarks/gw/bench_simulate.py [--events 20000] [--workers 1 2]

Writes ``benchmarks/results/gw_simulate.json``. The target (issue 3) is at
least 5,000 events/s on 2 cores with the built-in waveform.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))


def conditions() -> dict:
    import numpy
    import uproot

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "uproot": uproot.__version__,
        "machine": platform.machine(),
    }


def main() -> int:
    from rootclad.gw.dataset import simulate

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--events", type=int, default=20000)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--lal-events", type=int, default=1000, help="IMRPhenomD run (0: skip)")
    p.add_argument("--mf-segments", type=int, default=2000, help="matched-filter timing (0: skip)")
    p.add_argument("--out", default=str(HERE.parent / "results" / "gw_simulate.json"))
    args = p.parse_args()

    runs = []
    before = conditions()
    with tempfile.TemporaryDirectory() as tmp:
        for workers in args.workers:
            for rep in range(args.repeats):
                path = Path(tmp) / f"sim_{workers}_{rep}.root"
                t0 = os.times()
                r = simulate(path, args.events, seed=rep, workers=workers, progress=False)
                t1 = os.times()
                cpu_main = t1.user + t1.system - t0.user - t0.system
                cpu_workers = (
                    t1.children_user + t1.children_system - t0.children_user - t0.children_system
                )
                runs.append(
                    {
                        "approximant": "builtin",
                        "workers": workers,
                        "events": args.events,
                        "seconds": round(r.seconds, 3),
                        "events_per_second": round(r.events_per_second, 1),
                        "cpu_seconds_main": round(cpu_main, 2),
                        "cpu_seconds_workers": round(cpu_workers, 2),
                        "events_per_cpu_second": round(args.events / (cpu_main + cpu_workers), 1),
                        "file_MB": round(path.stat().st_size / 1e6, 1),
                        "load_average_after": os.getloadavg(),
                    }
                )
                print(json.dumps(runs[-1]))
                path.unlink()
        if args.lal_events:
            try:
                import lalsimulation  # noqa: F401
            except ImportError:
                print("lalsuite not installed: skipping the IMRPhenomD run")
            else:
                path = Path(tmp) / "lal.root"
                workers = max(args.workers)
                r = simulate(path, args.lal_events, seed=0, workers=workers, progress=False,
                             approximant="IMRPhenomD")  # fmt: skip
                runs.append(
                    {
                        "approximant": "IMRPhenomD",
                        "workers": workers,
                        "events": args.lal_events,
                        "seconds": round(r.seconds, 3),
                        "events_per_second": round(r.events_per_second, 1),
                    }
                )
                print(json.dumps(runs[-1]))
    matched = None
    if args.mf_segments:
        from rootclad.gw.dataset import SimulationConfig, event_seeds, generate_events
        from rootclad.gw.matched_filter import make_template_bank, matched_filter_snr

        t0 = time.perf_counter()
        bank = make_template_bank(t_ref=0.5)
        t_bank = time.perf_counter() - t0
        ev = generate_events(event_seeds(9, 0, args.mf_segments), SimulationConfig())
        t0 = time.perf_counter()
        matched_filter_snr(ev["strain"], bank)
        t_mf = time.perf_counter() - t0
        matched = {
            "templates": len(bank),
            "min_match": 0.97,
            "bank_seconds": round(t_bank, 1),
            "segments": args.mf_segments,
            "segments_per_second": round(args.mf_segments / t_mf, 1),
        }
        print(json.dumps(matched))
    result = {
        "benchmark": "rootclad.gw.simulate, 1 s segments at 2048 Hz, uncompressed, chunks of 1024 events",
        "conditions_before": before,
        "load_average_after": os.getloadavg(),
        "runs": runs,
        "matched_filter": matched,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
