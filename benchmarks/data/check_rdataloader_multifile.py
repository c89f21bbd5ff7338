"""Does ROOT's RDataLoader use both files when signal and background are stored apart?

    python benchmarks/data/check_rdataloader_multifile.py

Writes a signal file (label 1, ids 0..599) and a background file (label 0,
ids 10000..10799), loads them with ``ROOT.Experimental.ML.RDataLoader`` from a
list of RDataFrames and from one RDataFrame over both files, splits 75/25 and
prints, per split, the entries, the signal count, the distinct entries and how
many batches hold both classes. (The issue names this a known failure of
ROOT's loader; with ROOT 6.40 both forms used both files, see docs/data.md.)
"""

import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # fixtures/
sys.path.insert(0, str(REPO))

from fixtures.data import write_uproot  # noqa: E402

from rootclad.data.cling import import_root  # noqa: E402


def main() -> int:
    root = import_root()
    with tempfile.TemporaryDirectory() as tmp:
        sig = write_uproot(Path(tmp) / "sig.root", np.arange(600), np.ones(600), basket=64)
        bkg = write_uproot(Path(tmp) / "bkg.root", 10000 + np.arange(800), np.zeros(800), basket=50)
        for mode in ("list", "one dataframe"):
            if mode == "list":
                dfs = [root.RDataFrame("events", str(sig)), root.RDataFrame("events", str(bkg))]
            else:
                names = root.std.vector["std::string"]()
                names.push_back(str(sig))
                names.push_back(str(bkg))
                dfs = root.RDataFrame("events", names)
            dl = root.Experimental.ML.RDataLoader(
                dfs, batch_size=64, columns=["strain", "label"], max_vec_sizes={"strain": 64},
                target="label", shuffle=True, drop_remainder=False,
            )  # fmt: skip
            train, val = dl.train_test_split(test_size=0.25)
            for name, split in (("train", train), ("validation", val)):
                labels, ids, mixed, batches = [], [], 0, 0
                for x, y in split.as_numpy():
                    labels.append(y.ravel())
                    ids.append(np.rint(x[:, 0]))
                    batches += 1
                    mixed += len(set(y.ravel().tolist())) == 2
                labels, ids = np.concatenate(labels), np.concatenate(ids)
                print(
                    f"{mode:14s} {name:10s} entries {len(labels)} signal {int(labels.sum())} "
                    f"distinct {len(np.unique(ids))} batches {batches} with both classes {mixed}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
