"""Building C++ programs against the LibTorch of the installed torch wheel.

A LibTorch program uses a compiled model through ``rootclad/torch_function.h``; these flags
put that header, the torch headers and the torch libraries on its build line::

    $ python -m rootclad.torch.libtorch --cflags --libs
    -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1 -isystem .../torch/include ... -ltorch -ltorch_cpu -lc10

Compiling a file that includes ``<torch/torch.h>`` takes about 30 s; :func:`build_program`
caches the executable by a hash of the source, the flags, the compiler and rootclad's headers.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

from rootclad.toolchain import build_library, find_cxx, load_library


def _torch_dir() -> Path:
    return Path(torch.__file__).resolve().parent


def libtorch_flags() -> tuple[list[str], list[str]]:
    """``(compile flags, link flags)`` for a CPU LibTorch program that includes rootclad headers.

    The C++ ABI flag follows the wheel (``torch._C._GLIBCXX_USE_CXX11_ABI``); a mismatch
    links but fails at run time on every ``std::string`` crossing into libtorch. The link
    flags set an rpath to the wheel's libraries, so the program runs without LD_LIBRARY_PATH.
    """
    from rootclad.paths import get_include

    tdir = _torch_dir()
    inc, lib = tdir / "include", tdir / "lib"
    api_inc = inc / "torch" / "csrc" / "api" / "include"
    if not (api_inc / "torch" / "torch.h").is_file():
        raise FileNotFoundError(f"the torch wheel at {tdir} ships no C++ headers ({inc})")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cflags = [
        "-std=c++17",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-isystem",
        str(inc),
        "-isystem",
        str(api_inc),
        f"-I{get_include()}",
    ]
    ldflags = [f"-L{lib}", f"-Wl,-rpath,{lib}", "-ltorch", "-ltorch_cpu", "-lc10", "-ldl"]
    return cflags, ldflags


def build_program(
    source: str | Path,
    name: str,
    *,
    extra_flags: list[str] = (),
    opt_flags: list[str] = ("-O2",),
    timeout: float = 900,
) -> tuple[Path, bool]:
    """Compile a LibTorch C++ program into ``<cache>/libtorch/<name>-<key>``.

    Returns ``(executable, built_now)``. On a compile error the log is kept next to where
    the executable would be and :class:`rootclad.toolchain.CompileError` names it.
    """
    cxx, _ = find_cxx()
    cflags, ldflags = libtorch_flags()
    return build_library(
        Path(source).read_text(),
        name=name,
        cxx=cxx,
        flags=[*opt_flags, *cflags, *extra_flags],
        link_flags=ldflags,
        timeout=timeout,
        shared=False,
        subdir="libtorch",
    )


def build_trainer(timeout: float = 900) -> Path:
    """The library behind ``rootclad/libtorch_trainer.h`` (LibTorch training for ROOT sessions
    that should not parse the torch headers), built once into the cache; its path. It is
    loaded here once, so that a cached copy that does not load is built again."""
    from rootclad.paths import get_include

    cxx, _ = find_cxx()
    cflags, ldflags = libtorch_flags()
    source = Path(get_include()) / "rootclad" / "libtorch_trainer.cpp"
    build = functools.partial(
        build_library,
        source.read_text(),
        name="libtorch_trainer",
        cxx=cxx,
        flags=["-O2", *cflags],
        link_flags=ldflags,
        timeout=timeout,
        subdir="libtorch",
    )
    return load_library(build)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rootclad.torch.libtorch",
        description="print the flags that build a LibTorch program using rootclad headers",
    )
    parser.add_argument("--cflags", action="store_true", help="compile flags")
    parser.add_argument("--libs", action="store_true", help="link flags")
    parser.add_argument("--trainer", action="store_true",
                        help="build (once) the library of rootclad/libtorch_trainer.h and print "
                        "its path")  # fmt: skip
    args = parser.parse_args(argv)
    if args.trainer:
        print(build_trainer())
        return 0
    cflags, ldflags = libtorch_flags()
    show_all = not (args.cflags or args.libs)
    out = (cflags if args.cflags or show_all else []) + (ldflags if args.libs or show_all else [])
    print(" ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
