"""A compiled model in ROOT: exported files, ``rootclad::Model`` in Cling, RDataFrame columns.

>>> cm.export("build/gwnet")                        # build/gwnet.so, .root, .h (no ROOT needed)
>>> m = rootclad.root.load("build/gwnet")           # a ROOT.rootclad.Model
>>> df = rootclad.root.define_score(ROOT.RDataFrame("events", "gw.root"), "build/gwnet",
...                                 inputs="strain", column="score")
>>> rootclad.root.score_files(files, "build/gwnet", client=dask_client)  # a task per file
>>> ev = rootclad.root.evaluate("build/net", test={"signal": sig, "background": bkg})  # TMVA's

The same ``define_score`` works on a distributed RDataFrame (``executor=dask_client``); see
docs/distributed.md. rootclad's C++ errors are raised as :class:`ExportError` (an export that
cannot be opened) and :class:`ScoringError` (a file that cannot be scored), rootclad's message
first.

The C++ side is ``rootclad/include/rootclad/model.h``; it needs neither Python nor torch, so
macros and compiled programs use the same files (see docs/root.md).
"""

from rootclad.root.errors import ExportError, ScoringError
from rootclad.root.evaluate import Evaluation, evaluate
from rootclad.root.export import export
from rootclad.root.rdf import define_saliency, define_score, load, score_tree
from rootclad.root.scale_out import ScoredFiles, ScoreFilesError, score_files

__all__ = [
    "export",
    "load",
    "define_score",
    "define_saliency",
    "score_tree",
    "score_files",
    "evaluate",
    "Evaluation",
    "ScoredFiles",
    "ScoreFilesError",
    "ExportError",
    "ScoringError",
]
