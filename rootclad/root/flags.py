"""Flags that compile a C++ program using ``rootclad/model.h`` or ``tree_reader.h`` against ROOT.

The ``root-config`` of the ROOT wheel on PyPI points at a directory that does not exist
(``.../mock_site_packages/ROOT``), so these come from ROOT itself (``gROOT``'s include and
library directories)::

    $ g++ -O2 program.cpp -o program $(python -m rootclad.root.flags)
"""

from __future__ import annotations

import sys

# model.h and tree_reader.h use these (TFile, TTree, RNTuple, TMD5, RVec, the ImplicitMT
# pieces they pull in)
_LIBS = [
    "Core",
    "RIO",
    "Tree",
    "TreePlayer",
    "ROOTNTuple",
    "ROOTVecOps",
    "MathCore",
    "Imt",
    "Thread",
    "Net",
]


def root_flags() -> list[str]:
    """Compile and link flags: C++17, rootclad's and ROOT's headers, ROOT's libraries with an
    rpath (the program runs without LD_LIBRARY_PATH), and libdl for the model library."""
    from rootclad.data.cling import import_root
    from rootclad.paths import get_include

    root = import_root()
    inc, lib = str(root.gROOT.GetIncludeDir()), str(root.gROOT.GetLibDir())
    return [
        "-std=c++17",
        "-pthread",
        f"-I{get_include()}",
        f"-I{inc}",
        f"-L{lib}",
        f"-Wl,-rpath,{lib}",
        *(f"-l{name}" for name in _LIBS),
        "-ldl",
    ]


if __name__ == "__main__":
    print(" ".join(root_flags()))
    sys.exit(0)
