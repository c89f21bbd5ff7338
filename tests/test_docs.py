"""The README's speed table quotes the kept benchmark run, engine by engine; the benchmark
writes the tracked docs table only from a tracked run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "core"))

import bench_train_step  # noqa: E402

IMPLS = {"pullback engine": "pullback/pullbacks", "clad engine": "clad/pullbacks"}
MODELS = {"1-d CNN": "cnn", "MLP 2048-256-64-1": "mlp"}


def _speed_table() -> dict[tuple[str, str], list[str]]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Speed") :]
    section = section[: section.index("\n## ", 1)]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    heads = [c.strip() for c in lines[0].strip("|").split("|")]
    out = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        for head, cell in zip(heads[1:], cells[1:], strict=True):
            engine = next(k for k in IMPLS if head.startswith(k))
            out[(MODELS[cells[0]], IMPLS[engine])] = re.findall(r"([\d.]+)x", cell)
    return out


def _kept_speedups(report) -> dict[tuple[str, str], list[str]]:
    out: dict = {}
    for r in sorted(report["results"], key=lambda r: r["batch"]):
        out.setdefault((r["model"], r["impl"]), []).append(f"{r['speedup_vs_eager']:.2f}")
    return out


def test_readme_speed_table_quotes_the_kept_run_for_each_engine():
    report = json.loads(bench_train_step.RESULT.read_text())
    table = _speed_table()
    assert set(table) == {(m, i) for m in MODELS.values() for i in IMPLS.values()}
    kept = _kept_speedups(report)
    for key, quoted in table.items():
        assert quoted == kept[key], (key, quoted, kept[key])


def test_readme_check_fails_on_a_figure_the_run_did_not_produce():
    report = json.loads(bench_train_step.RESULT.read_text())
    for r in report["results"]:
        if (r["model"], r["impl"], r["batch"]) == ("cnn", "clad/pullbacks", 64):
            r["speedup_vs_eager"] += 0.5
    table, kept = _speed_table(), _kept_speedups(report)
    assert table[("cnn", "clad/pullbacks")] != kept[("cnn", "clad/pullbacks")]


def test_a_scratch_benchmark_run_leaves_the_tracked_docs_table_alone(tmp_path):
    report = json.loads(bench_train_step.RESULT.read_text())
    report["results"][0]["median_ms"] *= 3  # a scratch run measures other numbers
    before = bench_train_step.TABLE.read_bytes()
    bench_train_step.write_report(report, tmp_path / "scratch.json")
    assert bench_train_step.TABLE.read_bytes() == before
    assert (tmp_path / "scratch.md").read_text().startswith("# Train-step benchmark")
    assert json.loads((tmp_path / "scratch.json").read_text()) == report


def test_documentation_site_builds_without_warnings(tmp_path):
    """mkdocs.yml builds docs/ with the API reference from the docstrings; --strict turns
    every warning (a broken link, a missing page, an object the reference cannot find) into
    a failure."""
    pytest.importorskip("mkdocs", reason="the site needs the test extra (mkdocs)")
    pytest.importorskip("mkdocstrings", reason="the site needs the test extra (mkdocstrings)")
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                          str(tmp_path / "site")], cwd=repo, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("doc-heading") > 10


def _gw_run_quotes(text: str) -> list[str]:
    """The "a ± b" figures quoted next to "ratio" in a text."""
    return re.findall(r"ratio[^\n]*?(\d\.\d{3} ± \d\.\d{3})", text)


def _kept_ratios(preset: str) -> set[str]:
    s = json.loads((REPO / "benchmarks" / "results" / f"gw_run_{preset}.json").read_text())
    return {f"{r['value']:.3f} ± {r['std']:.3f}" for r in s["ratio"].values()}


def test_gw_run_figures_in_readme_and_docs_are_the_kept_runs():
    """README and docs/gw_run.md quote the SNR50 ratios of benchmarks/results/gw_run_*.json."""
    kept = _kept_ratios("default") | _kept_ratios("full")
    readme = _gw_run_quotes((REPO / "README.md").read_text())
    assert readme and set(readme) <= _kept_ratios("default"), readme
    rows = re.findall(r"\| (\d\.\d{3} ± \d\.\d{3}) \|", (REPO / "docs" / "gw_run.md").read_text())
    assert len(rows) == 6 and set(rows) <= kept, rows


def test_gw_run_figure_check_fails_on_a_figure_no_run_produced():
    assert not {"1.044 ± 0.014"} <= _kept_ratios("default")
    assert _gw_run_quotes("a ratio of 1.044 ± 0.014") == ["1.044 ± 0.014"]
