"""The ``rootclad`` command line: ``doctor``, ``build``, ``emit`` and the ``gw`` workflow (``gw run``,
the main job)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rootclad.data.errors import DataError
from rootclad.ir.graph import LOSSES
from rootclad.paths import check_outputs
from rootclad.toolchain import CompileError, ToolchainError

# What bad arguments or input raise; anything else is a bug and keeps its traceback.
_USER_ERRORS = (ValueError, TypeError, KeyError, OSError, DataError, ToolchainError, CompileError)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from rootclad.doctor import report

    print(report())
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    """``rootclad build module:callable -o STEM`` or ``rootclad build model.onnx -o STEM``:
    compile a torch or ONNX model and export it."""
    import importlib
    import time

    import torch

    import rootclad

    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    stem = Path(args.output)
    check_outputs(
        [args.source] * args.source.endswith(".onnx") + [args.weights] * bool(args.weights),
        [stem.with_name(stem.name + ext) for ext in (".so", ".root", ".h")],
    )
    if args.source.endswith(".onnx"):
        if args.weights or args.input_shape:
            raise ValueError(
                "an ONNX file holds its weights and input shape and is read "
                "through rootclad's table of ONNX ops: drop --weights and "
                "--input-shape"
            )
        t0 = time.perf_counter()
        cm = rootclad.onnx.load(args.source, loss=args.loss, engine=args.engine, dtype=dtype)
        paths = cm.export(args.output)
        print(f"built {args.source} ({cm.engine} engine, {args.dtype}, input {cm.input_shape}) "
              f"in {time.perf_counter() - t0:.1f} s: " + ", ".join(str(p) for p in paths.values()))  # fmt: skip
        return 0
    if not args.input_shape:
        raise ValueError("--input-shape is needed for a module:callable SOURCE (e.g. 1,2048)")
    module_name, sep, attr = args.source.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"SOURCE must be 'module:callable' or a .onnx file, got {args.source!r}")
    sys.path.insert(0, os.getcwd())  # as `python -m` would: the user's own modules
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot load {args.source}: {err}") from None
    net = factory()
    if not isinstance(net, torch.nn.Module):
        raise TypeError(f"{args.source}() returned {type(net).__name__}, not a torch.nn.Module")
    shape = tuple(int(v) for v in args.input_shape.replace(",", " ").split())
    example = torch.zeros((1, *shape), dtype=dtype)
    net = net.to(dtype)
    with torch.no_grad():
        net(example)  # materialises lazy layers before the weights are loaded
    if args.weights:
        state = torch.load(args.weights, map_location="cpu", weights_only=True)
        net.load_state_dict(state)
    net.eval()
    t0 = time.perf_counter()
    cm = rootclad.compile(net, example_input=example, loss=args.loss, engine=args.engine)
    if args.weights:  # a file a user may have been sent: its values checked as any state's
        cm.load_state_dict(state)
    paths = cm.export(args.output)
    print(
        f"built {args.source} ({cm.engine} engine, {args.dtype}, input {shape}) in "
        f"{time.perf_counter() - t0:.1f} s: " + ", ".join(str(p) for p in paths.values())
    )
    return 0


def _cmd_emit(args: argparse.Namespace) -> int:
    """``rootclad emit model.onnx -o net.hxx``: a standalone header and its weights."""
    import torch

    from rootclad.compiler import emit_file

    dtype = {"float32": torch.float32, "float64": torch.float64, None: None}[args.dtype]
    example = None
    if args.input_shape:
        shape = tuple(int(v) for v in args.input_shape.replace(",", " ").split())
        example = torch.zeros((2, *shape))
    paths = emit_file(
        args.source,
        args.output,
        name=args.name,
        dtype=dtype,
        example_input=example,
        trusted=args.trusted,
    )
    print(f"wrote {paths['header']} and {paths['weights']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from rootclad import __version__

    parser = argparse.ArgumentParser(
        prog="rootclad",
        description="Compile PyTorch and ONNX models to C++ with generated gradients, for ROOT: "
        "doctor (what was found), build and emit (export a model), gw (the gravitational-wave "
        "workflow; gw run is the main job).",
    )
    parser.add_argument("--version", action="version", version=f"rootclad {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="show which engines, compilers, BLAS and ROOT were found")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser(
        "build",
        help="compile a torch or ONNX model and export it for ROOT (STEM.so, STEM.root, STEM.h)",
        description="Compile the nn.Module that SOURCE ('module:callable') returns, with the "
        "weights of a state_dict file, or the ONNX file SOURCE (model.onnx), and export it "
        "(see docs/root.md).",
    )
    p.add_argument("source", help="'module:callable' returning a torch.nn.Module, or a .onnx file")
    p.add_argument("-o", "--output", required=True, help="the stem of the files to write")
    p.add_argument("--weights", help="a state_dict saved with torch.save")
    p.add_argument("--input-shape", help="per-sample input shape, e.g. 1,2048 (not for ONNX)")
    p.add_argument("--loss", default="bce_with_logits",
                   choices=list(LOSSES))  # fmt: skip
    p.add_argument("--engine", default="auto", choices=["auto", "clad", "pullback"])
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser(
        "emit",
        help="write a model file as a standalone C++ header (NAME.hxx) and weights (NAME.dat)",
        description="Write the model in SOURCE (.onnx, .pt2 or .pt) as one C++ header that g++ "
        "alone compiles, with a Session (infer, infer_pullback) and a Clad-convention pullback "
        "of NAME::infer, plus its weights file.",
    )
    p.add_argument("source", help="a .onnx, .pt2 (torch.export) or .pt (TorchScript) file")
    p.add_argument("-o", "--output", required=True, help="the header to write, e.g. gwnet.hxx")
    p.add_argument("--name", help="the C++ namespace (default: the header's file name)")
    p.add_argument("--dtype", choices=["float32", "float64"], help="default: the model's")
    p.add_argument("--input-shape", help="per-sample input shape (TorchScript files only)")
    p.add_argument("--trusted", action="store_true",
                   help="read a .pt2 or .pt file, whose torch loader runs code the file holds: "
                   "only for a file you made or trust")  # fmt: skip
    p.set_defaults(func=_cmd_emit)

    try:
        from rootclad.gw.cli import register as register_gw
    except ImportError:
        register_gw = None
    if register_gw is not None:
        register_gw(sub)

    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except _USER_ERRORS as err:
        # a mistake in the arguments or the input, not a bug: one line, no traceback
        # (ROOTCLAD_TRACEBACK=1 shows it)
        if os.environ.get("ROOTCLAD_TRACEBACK"):
            raise
        named = isinstance(err, OSError) and err.filename and err.strerror
        msg = f"{err.strerror}: {err.filename}" if named else err
        command = " ".join(filter(None, (args.command, getattr(args, "gw_command", None))))
        print(f"rootclad {command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C: one line, and the status a shell gives SIGINT
        if os.environ.get("ROOTCLAD_TRACEBACK"):
            raise
        command = " ".join(filter(None, (args.command, getattr(args, "gw_command", None))))
        print(f"rootclad {command}: {str(err) or 'interrupted'}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
