"""Data-parallel training (rootclad.distributed) against single-process training.

Two ranks are spawned on loopback (gloo). The reference is single-process rootclad training on
the union of the ranks' batches (cm.train_step, whose agreement with torch autograd and
torch.optim the training and fit tests check): float64, 20 steps, event weights, unequal and
empty shares, frozen tensors; rootclad.fit resumed on 2 ranks from a 1-rank checkpoint against
an uninterrupted 1-rank fit. A wrong normalisation, a missing all-reduce or an update of a
frozen tensor changes the parameters far beyond the 1e-10 allowed.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import rootclad
import rootclad.distributed as rd

F64 = torch.float64
STEPS = 20
GLOBAL = 24
# rank 0's share of each step's global batch (rank 1 takes the rest): unequal, and at step 7
# rank 1 has none, at step 12 rank 0 has none
SPLITS = [11 if s not in (7, 12) else (GLOBAL if s == 7 else 0) for s in range(STEPS)]


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 1)).double()


def _compile():
    return rootclad.compile(_net(), example_input=torch.zeros(1, 5, dtype=F64), engine="pullback")


def _data(seed=3, n=STEPS * GLOBAL):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g, dtype=F64)
    y = ((x[:, 0] * x[:, 1] + x[:, 2]) > 0).to(torch.int32)
    w = torch.rand(n, generator=g, dtype=F64) * 2 + 0.1
    return x, y, w


CASES = [("mean", ()), ("sum_w", ("0.bias", "2.weight"))]


def _run(cm, frozen, step_fn):
    for name, p in cm.named_parameters():
        p.requires_grad_(name not in frozen)
    opt = rootclad.optim.Adam(cm, lr=0.05)
    losses = [step_fn(cm, opt, s) for s in range(STEPS)]
    return losses, {k: v.clone() for k, v in cm.state_dict().items()}


def _steps_worker(rank, world_size):
    x, y, w = _data()
    out = []
    for norm, frozen in CASES:
        cm = _compile()
        if rank == 1:  # rank 0's parameters reach every rank
            with torch.no_grad():
                for p in cm.parameters():
                    p.add_(1.0)
        dp = rd.DataParallel(cm)

        def step(cm, opt, s, dp=dp, norm=norm):
            lo, mid, hi = s * GLOBAL, s * GLOBAL + SPLITS[s], (s + 1) * GLOBAL
            a, b = (lo, mid) if rank == 0 else (mid, hi)
            return dp.train_step(x[a:b], y[a:b], opt, weight=w[a:b], weight_norm=norm)

        out.append(_run(cm, frozen, step))
        out[-1] += (dp.timings["steps"],)
    return out


def test_two_ranks_equal_one_process_on_the_global_batch():
    x, y, w = _data()
    results = rd.spawn(_steps_worker, 2, threads=1)
    for (norm, frozen), r0, r1 in zip(CASES, results[0], results[1], strict=True):
        cm = _compile()
        start = {k: v.clone() for k, v in cm.state_dict().items()}

        def step(cm, opt, s, norm=norm):
            sl = slice(s * GLOBAL, (s + 1) * GLOBAL)
            return cm.train_step(x[sl], y[sl], opt, weight=w[sl], weight_norm=norm)

        losses, params = _run(cm, frozen, step)
        assert r0[2] == STEPS
        for got in (r0, r1):  # both ranks: the same losses and parameters as one process
            torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(losses), rtol=0,
                                       atol=1e-10)  # fmt: skip
            for k, v in params.items():
                torch.testing.assert_close(got[1][k], v, rtol=0, atol=1e-10, msg=k)
        for k in frozen:  # frozen stays frozen, on every rank
            assert torch.equal(r0[1][k], start[k]) and torch.equal(r1[1][k], start[k])
        moved = [k for k in params if k not in frozen]
        assert all(not torch.equal(params[k], start[k]) for k in moved)


def test_apply_grads_is_train_steps_update():
    """loss_and_grad, then apply_grads (the C API's optim_update), equals train_step, frozen
    tensors and their own step counts included."""
    x, y, w = _data()
    a, b = _compile(), _compile()
    for cm in (a, b):
        dict(cm.named_parameters())["0.bias"].requires_grad_(False)
    opt_a, opt_b = rootclad.optim.AdamW(a, lr=0.05), rootclad.optim.AdamW(b, lr=0.05)
    for s in range(6):
        sl = slice(s * GLOBAL, (s + 1) * GLOBAL)
        if s == 3:  # unfrozen from here on: its own step count lags
            for cm in (a, b):
                dict(cm.named_parameters())["0.bias"].requires_grad_(True)
        a.train_step(x[sl], y[sl], opt_a, weight=w[sl])
        b.loss_and_grad(x[sl], y[sl], weight=w[sl])
        b.apply_grads(opt_b)
    for k, v in a.state_dict().items():
        assert torch.equal(b.state_dict()[k], v), k
    assert opt_a._steps == opt_b._steps == [6, 3, 6, 6]


# -- rootclad.fit: 1 rank for an epoch, a checkpoint, 2 ranks for the rest ----------------------
EPOCHS, FIT_B = 3, 32


def _global_batches():
    x, y, w = _data(seed=5, n=5 * FIT_B - 7)  # a short last batch
    return [(x[i : i + FIT_B], y[i : i + FIT_B], w[i : i + FIT_B])
            for i in range(0, len(x), FIT_B)]  # fmt: skip


def _fit(model, opt, batches, epochs, **kw):
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    return rootclad.fit(model, opt, batches, epochs=epochs, validation=batches[:2],
                        scheduler=sched, weight_norm="sum_w", progress=False, **kw)  # fmt: skip


def _resume_worker(rank, world_size, ckpt, out):
    cm = _compile()
    dp = rd.DataParallel(cm)
    opt = rootclad.optim.Adam(cm, lr=0.05)
    share = [tuple(t[rank::world_size] for t in b) for b in _global_batches()]  # every 2nd event
    result = _fit(dp, opt, share, EPOCHS, resume=rd.load_checkpoint(ckpt),
                  on_epoch_end=lambda st: rd.save_checkpoint(st.checkpoint(), out))  # fmt: skip
    events = [h["events_per_s"] * h["seconds"] for h in result.history]
    return [h["train_loss"] for h in result.history], dict(cm.state_dict()), events


def test_resume_on_two_ranks_from_a_one_rank_checkpoint(tmp_path):
    batches = _global_batches()
    cm = _compile()
    whole = _fit(cm, rootclad.optim.Adam(cm, lr=0.05), batches, EPOCHS)
    reference = dict(cm.state_dict())

    first = _compile()
    ckpt = tmp_path / "epoch1.pt"
    _fit(first, rootclad.optim.Adam(first, lr=0.05), batches, 1,
         on_epoch_end=lambda st: rd.save_checkpoint(st.checkpoint(), ckpt))  # fmt: skip
    out = tmp_path / "last.pt"
    results = rd.spawn(_resume_worker, 2, str(ckpt), str(out), threads=1)
    losses = [h["train_loss"] for h in whole.history]
    for got_losses, got_params, events in results:
        torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(losses), rtol=0,
                                   atol=1e-10)  # fmt: skip
        # the speed in the history counts the events of every rank
        assert [round(e) for e in events] == [5 * FIT_B - 7] * EPOCHS
        for k, v in reference.items():
            torch.testing.assert_close(got_params[k], v, rtol=0, atol=1e-10, msg=k)
    last = rd.load_checkpoint(out)  # rank 0's, whole
    assert last["epoch"] == EPOCHS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch1.pt", "last.pt"]  # no temp


# -- bad input --------------------------------------------------------------------------------
def test_no_process_group():
    with pytest.raises(RuntimeError, match="not initialised.*rootclad.distributed.init"):
        rd.DataParallel(_compile())


def _disagreeing_worker(rank, world_size):
    cm = _compile()
    if rank == 1:
        next(iter(cm.parameters())).requires_grad_(False)
    rd.DataParallel(cm)


def test_ranks_that_disagree_about_the_model():
    _compile()  # built once here, found in the cache by the ranks
    with pytest.raises(Exception, match=r"rank\(s\) \[1\] hold another model than rank 0"):
        rd.spawn(_disagreeing_worker, 2, threads=1)


def _error(fn) -> str:
    try:
        fn()
    except Exception as err:  # noqa: BLE001 (the message is the result)
        return f"{type(err).__name__}: {err}"
    return "no error"


def _failing_worker(rank, world_size, path):
    """Rank 1 fails before the all-reduce (a NaN input), then its checkpoint write would be
    rank 0's failure; then the ranks' batches differ in number (readers with a len(), a
    generator, a loop of the user's own before a checkpoint, dp.batches), the ranks differ
    in their validation, one refuses a checkpoint: every rank must raise, none wait for the
    others forever or abort in gloo, and the ranks must stay in step for the next call."""
    x, y, w = _data()
    cm = _compile()
    dp = rd.DataParallel(cm)
    opt = rootclad.optim.Adam(cm, lr=0.05)
    xb = x[:8].clone()
    if rank == 1:
        xb[0, 0] = float("nan")
    out = [_error(lambda: dp.train_step(xb, y[:8], opt))]
    n = 8 if rank == 0 else 12  # rank 0: 2 batches of 4, rank 1: 3
    batches = [(x[i : i + 4], y[i : i + 4]) for i in range(0, n, 4)]
    out.append(_error(lambda: rootclad.fit(dp, opt, batches, epochs=1, progress=False)))
    gen = ((x[i : i + 4], y[i : i + 4]) for i in range(0, n, 4))  # no len()
    out.append(_error(lambda: rootclad.fit(dp, opt, gen, epochs=1, progress=False)))

    def own_loop():
        for i in range(0, n, 4):
            dp.train_step(x[i : i + 4], y[i : i + 4], opt)
        rd.save_checkpoint({"epoch": 1}, path)  # rank 0 is here while rank 1 steps

    out.append(_error(own_loop))
    out.append(_error(lambda: [dp.train_step(*b, opt) for b in dp.batches(batches)]))
    # a sharded validation whose last share is empty on rank 1: skipped, not an error
    val = [(x[:3], y[:3]), (x[:0], y[:0]) if rank == 1 else (x[3:4], y[3:4])]
    train = [(x[i : i + 4], y[i : i + 4]) for i in range(0, 8, 4)]
    out.append(
        _error(
            lambda: rootclad.fit(
                dp, opt, train, epochs=1, progress=False, validation=None if rank == 0 else val
            )
        )
    )
    saved = []
    res = rootclad.fit(
        dp,
        opt,
        train,
        epochs=1,
        validation=val,
        progress=False,
        on_epoch_end=lambda st: saved.append(st.checkpoint()),
    )
    out.append(res.history[0]["val_loss"])
    if rank == 1:  # found by the optimizer's check: it is check_checkpoint's too
        saved[0]["optimizer"]["state"][0] = float("nan")
    out.append(
        _error(lambda: rootclad.fit(dp, opt, train, epochs=2, progress=False, resume=saved[0]))
    )
    out.append(dp.reduce_sums(1.0)[0])  # still in step
    return out


def test_a_failing_rank_and_disagreeing_readers_raise_on_every_rank(tmp_path):
    _compile()
    path = tmp_path / "ckpt.pt"
    r0, r1 = rd.spawn(_failing_worker, 2, str(path), threads=1)
    assert r1[0].startswith("ValueError") and "non-finite" in r1[0], r1
    assert r0[0].startswith("RuntimeError") and "rank(s) [1]" in r0[0], r0
    for r in (r0, r1):
        assert "different numbers of batches (rank 0: 2, rank 1: 3)" in r[1], r
        assert r[2].startswith("RuntimeError"), r  # the generator: found at rank 1's 3rd step
        assert "rank 0 has no batch after 2" in r[2] and "rank 1 makes train_step 3" in r[2], r
        assert "rank 0 saves a checkpoint after 2 train_steps" in r[3], r
        assert "rank 1 makes train_step 3" in r[3], r
        assert "different numbers of batches (rank 0: 2, rank 1: 3)" in r[4], r
        assert "validation" in r[5] and "rank 0: none, rank 1: 2 batches" in r[5], r
        assert r[8] == 2.0
    assert not path.exists()  # the checkpoint of ranks out of step: not written
    assert r0[6] == r1[6] and math.isfinite(r0[6])  # the same global validation loss
    assert r1[7].startswith("ValueError") and "'optimizer'['state']" in r1[7], r1
    assert "rank(s) [1] refused the checkpoint" in r0[7], r0


# -- torchrun (env:// initialisation) ---------------------------------------------------------
_SCRIPT = """
import sys, torch, rootclad, rootclad.distributed as rd
sys.path.insert(0, {here!r})
import test_distributed as t
rank, world = rd.init()
x, y, w = t._data()
cm = t._compile()
dp = rd.DataParallel(cm)
opt = rootclad.optim.SGD(cm, lr=0.1, momentum=0.9)
for s in range(5):
    sl = slice(s * t.GLOBAL + rank, (s + 1) * t.GLOBAL, world)
    dp.train_step(x[sl], y[sl], opt, weight=w[sl])
rd.save_checkpoint(dict(cm.state_dict()), {out!r} + str(rank))
"""


def test_torchrun(tmp_path):
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not on PATH")
    script = tmp_path / "train.py"
    out = str(tmp_path / "params")
    script.write_text(_SCRIPT.format(here=str(Path(__file__).parent), out=out))
    env = {**os.environ, "ROOTCLAD_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
    _compile()
    run = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", str(script)],
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params0", "train.py"]  # rank 0 only
    x, y, w = _data()
    cm = _compile()
    opt = rootclad.optim.SGD(cm, lr=0.1, momentum=0.9)
    for s in range(5):
        sl = slice(s * GLOBAL, (s + 1) * GLOBAL)
        cm.train_step(x[sl], y[sl], opt, weight=w[sl])
    got = rd.load_checkpoint(out + "0")
    for k, v in cm.state_dict().items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=1e-10, msg=k)


# -- BatchNorm: per-rank statistics, as DDP without SyncBatchNorm ------------------------------
def _bn_compile():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 1)).double()
    return rootclad.compile(net, example_input=torch.zeros(2, 5, dtype=F64), engine="pullback")


def _bn_worker(rank, world_size):
    x, y, _ = _data()
    cm = _bn_compile()
    dp = rd.DataParallel(cm)
    opt = rootclad.optim.SGD(cm, lr=0.1)
    sl = slice(rank * 12, (rank + 1) * 12)
    dp.train_step(x[sl], y[sl], opt)
    return dict(cm.state_dict())


def test_batchnorm_statistics_are_per_rank():
    """One step on 2 ranks equals one process that averages the gradients of the two halves,
    each normalised with its own statistics; the running statistics are each rank's own."""
    x, y, _ = _data()
    results = rd.spawn(_bn_worker, 2, threads=1)
    cm = _bn_compile()
    start = {k: v.clone() for k, v in cm.state_dict().items()}
    cm.train()
    grads, running = [], []
    for r in range(2):
        cm.load_state_dict(start)
        grads.append(cm.loss_and_grad(x[r * 12 : (r + 1) * 12], y[r * 12 : (r + 1) * 12])[1])
        running.append(dict(cm.state_dict())["1.running_mean"].clone())
    for k, v in start.items():
        if k in grads[0]:
            expected = v - 0.1 * (grads[0][k] + grads[1][k]) / 2
            for got in results:
                torch.testing.assert_close(got[k], expected, rtol=0, atol=1e-12, msg=k)
    for r in range(2):
        torch.testing.assert_close(results[r]["1.running_mean"], running[r], rtol=0, atol=1e-12)
    assert not torch.equal(running[0], running[1])
