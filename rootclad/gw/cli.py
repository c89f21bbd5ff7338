"""``rootclad gw ...``: the main job (``run``) and the dataset tools (``simulate``, ``info``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _pair(text: str) -> tuple[float, float]:
    parts = text.replace(",", " ").split()
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected two numbers 'LOW,HIGH', got {text!r}")
    return float(parts[0]), float(parts[1])


def _cmd_simulate(args: argparse.Namespace) -> int:
    from rootclad.gw.dataset import simulate

    result = simulate(
        args.output,
        args.n_events,
        seed=args.seed,
        snr=args.snr,
        signal_fraction=args.signal_fraction,
        duration=args.duration,
        sample_rate=args.sample_rate,
        mass_range=args.mass_range,
        t_merger=args.t_merger,
        approximant=args.approximant,
        psd=args.psd,
        band=args.band,
        compression=args.compression,
        chunk_size=args.chunk_size,
        workers=args.workers,
        progress=not args.quiet,
    )
    print(
        f"wrote {result.n_events} events to {result.path} in {result.seconds:.1f} s "
        f"({result.events_per_second:.0f} events/s)"
    )
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    import uproot

    from rootclad.gw.dataset import read_config

    with uproot.open(args.file) as f:
        tree = f["events"]
        n_entries = tree.num_entries
        labels = tree["label"].array(library="np")
    print(json.dumps(json.loads(read_config(args.file).to_json()), indent=2, sort_keys=True))
    print(f"events: {n_entries} ({int(labels.sum())} signal, {int((labels == 0).sum())} noise)")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from rootclad.gw.run.config import resolve
    from rootclad.gw.run.pipeline import run

    n = args.events
    cfg = resolve(
        args.config, args.preset, model=args.model, engine=args.engine, epochs=args.epochs,
        device=args.device, seed=args.seed, approximant=args.approximant,
        compression=args.compression, workers=args.workers, scheduler=args.scheduler,
        train_events=n,
        val_events=None if n is None else max(n // 6, 256),
        test_events=None if n is None else max(n // 2, 1024),
    )  # fmt: skip
    summary = run(cfg, Path(args.out), resume=args.resume, progress=None if not args.quiet else False,
                  log=print)  # fmt: skip
    k = "1e-2"
    r = summary["ratio"][k]
    ratio = "n/a" if r["value"] is None else f"{r['value']:.3f} ± {r['std']:.3f}"
    print(f"AUC network {summary['auc']['network']:.4f}, matched filter "
          f"{summary['auc']['matched_filter']:.4f}; SNR50 ratio network / matched filter at "
          f"false-alarm probability {k}: {ratio}")  # fmt: skip
    return 0


def _faps(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers 'A,B,...', got {text!r}") from None


def _cmd_background(args: argparse.Namespace) -> int:
    from rootclad.gw.run.background import StudyConfig, run_study

    sc = StudyConfig(
        segments=args.segments,
        per_task=args.per_task,
        seed=args.seed,
        faps=args.faps,
        keep=args.keep,
        bootstrap=args.bootstrap,
        min_match=args.min_match,
    )
    s = run_study(
        Path(args.run),
        args.out and Path(args.out),
        sc,
        workers=args.workers,
        scheduler=args.scheduler,
        connect_timeout=args.connect_timeout,
        progress=not args.quiet,
        log=print,
        mf_cache=not args.no_mf_cache,
    )
    out = Path(args.out) if args.out else Path(args.run) / "background"
    print(f"{s['segments']} segments; {s['verdict']}")
    print(f"report: {out / 'background.html'}")
    return 0


def register(subparsers) -> None:
    """Add the ``gw`` command (``simulate``, ``info``) to the ``rootclad`` sub-parsers."""
    gw = subparsers.add_parser("gw", help="the gravitational-wave workflow and dataset tools")
    sub = gw.add_subparsers(dest="gw_command", required=True)

    p = sub.add_parser(
        "simulate",
        help="write simulated whitened detector strain (TTree 'events') to a ROOT file",
        description="Simulate whitened Advanced-LIGO-like strain segments, half of them "
        "with an injected binary-merger signal, into a ROOT file.",
    )
    p.add_argument("output", help="ROOT file to write (replaced atomically when complete)")
    p.add_argument("-n", "--n-events", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--snr", type=_pair, default=(5.0, 20.0), help="optimal SNR range LOW,HIGH")
    p.add_argument("--signal-fraction", type=float, default=0.5)
    p.add_argument("--duration", type=float, default=1.0, help="segment length (s)")
    p.add_argument("--sample-rate", type=float, default=2048.0)
    p.add_argument("--mass-range", type=_pair, default=(5.0, 95.0), help="solar masses LOW,HIGH")
    p.add_argument("--t-merger", type=_pair, default=None, help="seconds from segment start")
    p.add_argument("--approximant", default="builtin", help="'builtin' or a LALSimulation name")
    p.add_argument("--psd", default="aligo", help="'aligo' or 'lal:<name>'")
    p.add_argument("--band", type=_pair, default=(20.0, 1000.0), help="whitening band (Hz)")
    p.add_argument("--compression", default="lz4", help="lz4, none, zlib, lzma, zstd[:level]")
    p.add_argument(
        "--chunk-size",
        type=int,
        default=1024,
        help="events per basket (8 MB of strain at 2048 samples)",
    )
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser(
        "run",
        help="the main job: simulate, train the GW CNN, compare with the matched filter, report",
        description="Simulate training, validation and test sets, train the GW CNN through the "
        "compiled model, evaluate it and the matched filter on the same test events (ROC, "
        "efficiency vs SNR at false-alarm probabilities 1e-1..1e-3, SNR at 50% efficiency), "
        "explain it with saliency maps, score the test file in ROOT and write report.md, "
        "report.html and summary.json (see docs/gw_run.md).",
    )
    p.add_argument("--config", help="a TOML file of RunConfig keys (see the written config.toml)")
    p.add_argument(
        "--out",
        default="rootclad-gw-run",
        help="output directory (default: %(default)s, in the current directory)",
    )
    p.add_argument(
        "--events",
        type=int,
        help="training events N an epoch, simulated for each (--preset full: train.root's) (the "
        "default preset's 24576: "
        "validation 4096, test 12288; with --events, validation N/6 (at least 256) and test N/2 "
        "(at least 1024))",
    )
    p.add_argument(
        "--epochs",
        type=int,
        help="most training epochs (10, or 30 with --preset full; training stops early once the "
        "validation loss stops improving)",
    )
    p.add_argument(
        "--model", choices=["cnn", "mlp", "resnet", "resnet-deep"], help="the network (default cnn)"
    )
    p.add_argument("--engine", choices=["auto", "clad", "pullback"],
                   help="how the backward is written (default auto: Clad where found)")  # fmt: skip
    p.add_argument("--seed", type=int, help="of the simulation and the training (default 1)")
    p.add_argument("--approximant", help="'builtin' (default) or a LALSimulation name, e.g. "
                   "IMRPhenomD (needs lalsuite)")  # fmt: skip
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="train, score and explain on the GPU with --device cuda (needs nvcc)",
    )
    p.add_argument("--compression", choices=["lz4", "none", "zlib", "zstd", "lzma"],
                   help="of the data files (default lz4; zlib also detects corrupted strain)")  # fmt: skip
    p.add_argument(
        "--preset",
        default="default",
        choices=["default", "full", "search"],
        help="sizes of the run (default: the embedded default; full: more data and "
        "epochs; search: training for the noise tail, then a background study of "
        "2e6 noise segments; see docs/gw_run.md)",
    )
    p.add_argument(
        "--workers",
        type=int,
        help="simulate, train (data-parallel, one rank per worker; training for the noise "
        "tail, as --preset search's, trains in this process) and score on N local Dask worker "
        "processes (default: this process alone; docs/gw_run.md)",
    )
    p.add_argument("--scheduler", help="a Dask scheduler's address (tcp://host:port): the same "
                   "on its workers, which must see --out at the same path")  # fmt: skip
    p.add_argument("--resume", action="store_true", help="continue from out/checkpoint.pt")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser(
        "background",
        help="false-alarm probabilities down to 1e-5: a run's network and matched filter on "
        "millions of noise-only segments",
        description="Generate noise-only segments on workers from per-task seeds, score them "
        "with a `rootclad gw run` directory's trained network and template bank, keep the "
        "loudest values and histograms per task (written atomically: a rerun resumes), then "
        "set thresholds at the requested false-alarm probabilities and measure both methods' "
        "efficiency and SNR50 there on the run's test signals (see docs/gw_background.md).",
    )
    p.add_argument("run", help="a `rootclad gw run` output directory (its model, config and "
                   "test file are read)")  # fmt: skip
    p.add_argument("--out", help="results directory (default RUN/background); rerunning with "
                   "the same one computes only the unfinished tasks")  # fmt: skip
    p.add_argument("--segments", type=int, default=100_000,
                   help="noise-only segments in all (rounded up to whole tasks; a threshold at "
                   "false-alarm probability p needs at least 1/p)")  # fmt: skip
    p.add_argument("--per-task", type=int, default=4096, help="segments per task")
    p.add_argument("--seed", type=int, default=0, help="the study's seed (task i draws from "
                   "SeedSequence(seed, spawn_key=(i,)))")  # fmt: skip
    p.add_argument("--faps", type=_faps, default=(1e-3, 1e-4, 1e-5),
                   help="false-alarm probabilities, comma-separated (default 1e-3,1e-4,1e-5)")  # fmt: skip
    p.add_argument("--keep", type=int, default=2000, help="loudest values of each statistic "
                   "kept per task (thresholds are exact down to where they reach)")  # fmt: skip
    p.add_argument("--bootstrap", type=int, default=200, help="resamplings for the SNR50 errors")
    p.add_argument(
        "--min-match",
        type=float,
        help="the template bank's minimal match (default: "
        "the run's bank_min_match, 0.97; 0.99 places about twice the templates)",
    )
    p.add_argument(
        "--no-mf-cache",
        action="store_true",
        help="compute the matched filter of "
        "every task, not taking a study's on the same noise and bank from the "
        "private cache",
    )
    p.add_argument("--workers", type=int, default=1,
                   help="local worker processes (default 1: this process)")  # fmt: skip
    p.add_argument("--scheduler", help="a Dask scheduler's address (tcp://host:port): run the "
                   "tasks on its workers instead of local processes")  # fmt: skip
    p.add_argument("--connect-timeout", type=float, default=10.0,
                   help="seconds to wait for the scheduler to answer (default 10)")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_background)

    p = sub.add_parser("info", help="print the configuration and counts of a simulated file")
    p.add_argument("file")
    p.set_defaults(func=_cmd_info)
