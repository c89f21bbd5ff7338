"""Ctrl-C during any stage of ``rootclad gw run`` stops the run within seconds with one line
(exit status 130, as a shell reports SIGINT), no traceback and no temporary file left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = """train_events = 300
val_events = 100
test_events = 400
patience = 40
model = "mlp"
engine = "pullback"
bootstrap = 5
bank_min_match = 0.9
saliency_examples = 1
"""


def _interrupt_at(tmp_path, line_start: str, epochs: int) -> tuple[int, str, str, float]:
    """Run ``gw run`` and send SIGINT when a log line starts with ``line_start``; returns the
    exit status, the log, stderr and the seconds from the signal to the exit."""
    (tmp_path / "run.toml").write_text(TINY + f"epochs = {epochs}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env.pop("ROOTCLAD_TRACEBACK", None)
    with subprocess.Popen(
        [sys.executable, "-m", "rootclad.cli", "gw", "run", "-q", "--config",
         str(tmp_path / "run.toml"), "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    ) as proc:  # fmt: skip
        log = []
        try:
            for line in proc.stdout:
                log.append(line)
                if line.startswith(line_start):
                    break
            else:
                pytest.fail(
                    f"the run ended before {line_start!r}: {''.join(log)}{proc.stderr.read()}"
                )
            t = time.perf_counter()
            proc.send_signal(signal.SIGINT)
            rest, err = proc.communicate(timeout=60)
            return proc.returncode, "".join(log) + rest, err, time.perf_counter() - t
        finally:
            if proc.poll() is None:
                proc.kill()


def _check_stopped(tmp_path, status, err, seconds, stage):
    assert status == 130, err
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if "rootclad gw run" in x]
    assert len(lines) == 1 and f"interrupted during {stage}" in lines[0], err
    assert seconds < 10, seconds
    assert not [p for p in (tmp_path / "out").rglob("*") if "partial" in p.name]


@pytest.mark.slow
def test_ctrl_c_while_training_stops_the_run(tmp_path):
    status, log, err, seconds = _interrupt_at(tmp_path, "epoch 2:", epochs=40)
    _check_stopped(tmp_path, status, err, seconds, "train")
    assert "epoch 40:" not in log


@pytest.mark.slow
def test_ctrl_c_while_scoring_in_root_stops_the_run(tmp_path):
    pytest.importorskip("ROOT")
    status, log, err, seconds = _interrupt_at(tmp_path, "== score in ROOT", epochs=1)
    _check_stopped(tmp_path, status, err, seconds, "score in ROOT")
    assert not (tmp_path / "out" / "scores.root").exists()
