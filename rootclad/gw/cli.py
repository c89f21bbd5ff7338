"""``rootclad gw ...``: dataset tools (``simulate``, ``info``)."""

from __future__ import annotations

import argparse
import json


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


def register(subparsers) -> None:
    """Add the ``gw`` command (``simulate``, ``info``) to the ``rootclad`` sub-parsers."""
    gw = subparsers.add_parser("gw", help="gravitational-wave dataset tools")
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
    p.add_argument("--compression", default="none", help="none, lz4, zlib, lzma, zstd[:level]")
    p.add_argument(
        "--chunk-size",
        type=int,
        default=1024,
        help="events per basket (8 MB of strain at 2048 samples)",
    )
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("info", help="print the configuration and counts of a simulated file")
    p.add_argument("file")
    p.set_defaults(func=_cmd_info)
