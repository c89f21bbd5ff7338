"""The test suite's profile: where the README's test command spends its time.

Reads the output of a pytest run made with ``--durations=0`` (every test's setup, call and
teardown; pytest prints them, slowest first, under "slowest durations") and its last line (the
counts and the wall time), and writes the time per test module and the slowest tests.

usage: PYTEST_ADDOPTS=--durations=0 .ci/run 2>&1 | tee suite.log
       python benchmarks/core/suite_profile.py suite.log [--out PATH]
Writes benchmarks/results/test_suite.json and docs/benchmarks/test_suite.md.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "test_suite.json"
TABLE = REPO / "docs" / "benchmarks" / "test_suite.md"
sys.path.insert(0, str(REPO / "benchmarks"))

DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(.+?)\s*$")  # ids hold spaces
SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in (\d+\.\d+)s")  # with -q: no "="


def parse(text: str) -> dict:
    """The durations and the summary of a pytest log; an error when either is missing."""
    tests = defaultdict(float)
    for line in text.splitlines():
        m = DURATION.match(line.strip())
        if m:
            tests[m[3]] += float(m[1])
    summary = [m for m in map(SUMMARY.match, text.splitlines()) if m]
    if not tests or not summary:
        raise SystemExit("no durations or no summary line: run pytest with --durations=0")
    counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (\w+)", summary[-1][1]))
    modules = defaultdict(float)
    for test, seconds in tests.items():
        modules[test.split("::")[0]] += seconds
    return {
        "wall_s": float(summary[-1][2]),
        "counts": counts,
        "modules": dict(sorted(modules.items(), key=lambda kv: -kv[1])),
        "slowest": dict(sorted(tests.items(), key=lambda kv: -kv[1])[:25]),
    }


def render(report: dict) -> str:
    wall, counts = report["wall_s"], report["counts"]
    listed = sum(report["modules"].values())
    lines = [
        "# The test suite's profile",
        "",
        f"`benchmarks/core/suite_profile.py`, {report['date']}, {report['machine']}, torch "
        f"{report['torch']}: the README's test command (`.ci/run`) with "
        f"`PYTEST_ADDOPTS=--durations=0`. Wall time {wall / 60:.1f} min; "
        + ", ".join(f"{n} {k}" for k, n in counts.items())
        + f". The tests' own setup, call and teardown add up to {listed / 60:.1f} min; the "
        "rest is collection and pytest itself.",
        "",
        "| test module | seconds | share |",
        "| --- | ---: | ---: |",
    ]
    for module, s in list(report["modules"].items())[:30]:
        lines.append(f"| `{module}` | {s:.0f} | {s / listed:.1%} |")
    lines += [
        "",
        "The slowest tests (setup, call and teardown together):",
        "",
        "| test | seconds |",
        "| --- | ---: |",
    ]
    for test, s in report["slowest"].items():
        lines.append(f"| `{test}` | {s:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from report import run_header, write_report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path, help="the output of a pytest run with --durations=0")
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    report = run_header(**parse(args.log.read_text(errors="replace")))
    return write_report(report, args.out, RESULT, TABLE, render)


if __name__ == "__main__":
    raise SystemExit(main())
