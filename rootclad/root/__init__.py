"""A compiled model in ROOT: exported files, ``rootclad::Model`` in Cling, RDataFrame columns.

>>> cm.export("build/gwnet")                        # build/gwnet.so, .root, .h (no ROOT needed)
>>> m = rootclad.root.load("build/gwnet")           # a ROOT.rootclad.Model
>>> df = rootclad.root.define_score(ROOT.RDataFrame("events", "gw.root"), "build/gwnet",
...                                 inputs="strain", column="score")

The C++ side is ``rootclad/include/rootclad/model.h``; it needs neither Python nor torch, so
macros and compiled programs use the same files (see docs/root.md).
"""

from rootclad.root.export import export
from rootclad.root.rdf import define_saliency, define_score, load, score_tree

__all__ = ["export", "load", "define_score", "define_saliency", "score_tree"]
