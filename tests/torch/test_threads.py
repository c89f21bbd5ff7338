"""One compiled model used from several Python threads at once.

ctypes releases the GIL during the C++ calls, so the threads really overlap. Every result
must equal the one the same call gives when the threads run one after another: predict and
cm(x) run side by side (each thread has its own workspace), loss_and_grad and train_step on
one model are serialized, and two models train side by side (each library has its own pool).
"""

from __future__ import annotations

import shutil
import subprocess
import threading

import pytest
import torch
from fixtures.core import mixed_batch, mixed_model
from torch import nn

import rootclad

F64 = torch.float64
THREADS = 4
ROUNDS = 30


def _in_threads(work, n=THREADS):
    """Runs work(t) for t < n in n threads started together; returns the results by t."""
    results, errors = [None] * n, []
    start = threading.Barrier(n)

    def run(t):
        try:
            start.wait()
            results[t] = work(t)
        except BaseException as e:  # re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results


def _inputs(t):
    """Thread t's batches: sizes differ between threads, so workspaces differ in size."""
    return [mixed_batch(B=1 + (t * 7 + r) % 23, seed=100 * t + r) for r in range(ROUNDS)]


def _model():
    torch.manual_seed(0)
    net = mixed_model().eval()
    x, _ = mixed_batch(2)
    return net, rootclad.compile(net, example_input=x, loss="cross_entropy", engine="pullback")


def test_predict_and_autograd_from_several_threads_match_serial_calls():
    _, cm = _model()
    inputs = [_inputs(t) for t in range(THREADS)]

    def work(t):
        outs = []
        for x, _ in inputs[t]:
            outs.append(cm.predict(x))
            xg = x.clone().requires_grad_(True)
            (g,) = torch.autograd.grad(cm(xg).square().sum(), [xg])
            outs.append(g)
        return outs

    serial = [work(t) for t in range(THREADS)]
    for parallel in (_in_threads(work), _in_threads(work)):
        for t in range(THREADS):
            for a, b in zip(parallel[t], serial[t], strict=True):
                assert torch.equal(a, b), f"thread {t}: a result differs from the serial call"


def test_loss_and_grad_from_several_threads_match_serial_calls():
    _, cm = _model()
    inputs = [_inputs(t) for t in range(THREADS)]

    def work(t):
        return [cm.loss_and_grad(x, y) for x, y in inputs[t]]

    serial = [work(t) for t in range(THREADS)]
    parallel = _in_threads(work)
    for t in range(THREADS):
        for (v, g), (v0, g0) in zip(parallel[t], serial[t], strict=True):
            assert torch.equal(v, v0), f"thread {t}: loss {v} != {v0}"
            for k in g0:
                assert torch.equal(g[k], g0[k]), f"thread {t}: gradient of {k} differs"


def test_train_step_from_several_threads_takes_every_step():
    """Plain SGD on w (6 weights, no bias) from 4 threads, thread t on x = e_t, y = 1, mse:
    a step moves w_t only, to w_t + 2 lr (1 - w_t), so the result does not depend on how
    the threads interleave, but a step that read another thread's input would move the
    wrong weight, and a lost step would leave w_t short."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 1, bias=False)).double()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 6, dtype=F64), loss="mse")
    with torch.no_grad():
        dict(cm.named_parameters())["0.weight"].zero_()
    opt = rootclad.optim.SGD(cm, lr=0.01)
    # w = 0, y = 1 and x = e_t: each thread's steps move only its own coordinate
    xs = [torch.eye(6, dtype=F64)[t : t + 1] for t in range(THREADS)]
    y = torch.ones(1, 1, dtype=F64)

    def work(t):
        for _ in range(ROUNDS):
            cm.train_step(xs[t], y, opt)

    _in_threads(work)
    assert opt.step_count == THREADS * ROUNDS
    # coordinate t followed w <- w + 2 lr (1 - w) ROUNDS times, whatever the interleaving
    w_ref = torch.zeros(1, dtype=F64)
    for _ in range(ROUNDS):
        w_ref = w_ref + 2 * 0.01 * (1 - w_ref)
    w = cm.state_dict()["0.weight"][0]
    assert torch.allclose(w[:THREADS], w_ref.expand(THREADS), rtol=1e-12, atol=0)
    assert torch.equal(w[THREADS:], torch.zeros(6 - THREADS, dtype=F64))


def test_two_models_train_side_by_side_as_they_do_alone():
    """Two models in two threads share rootclad's thread pool; each run equals its run alone."""
    torch.manual_seed(0)
    nets = [mixed_model(), mixed_model()]
    x0, _ = mixed_batch(2)
    batches = [_inputs(t) for t in range(2)]

    def fresh():  # dropout seeds count a model's calls: each run starts from a new model
        return [
            rootclad.compile(n, example_input=x0, loss="cross_entropy", engine="pullback")
            for n in nets
        ]

    def work(cms, t):
        opt = rootclad.optim.Adam(cms[t], lr=1e-3)
        losses = [cms[t].train_step(x, y, opt) for x, y in batches[t]]
        return losses, {k: v.clone() for k, v in cms[t].state_dict().items()}

    cms = fresh()
    alone = [work(cms, t) for t in range(2)]
    cms = fresh()
    together = _in_threads(lambda t: work(cms, t), n=2)
    for t in range(2):
        assert together[t][0] == alone[t][0], f"model {t}: loss history differs"
        for k, v in alone[t][1].items():
            assert torch.equal(together[t][1][k], v), f"model {t}: {k} differs"


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
@pytest.mark.parametrize("engine", ["pullback", "clad"])
def test_a_model_library_exports_its_c_api_only(engine, request):
    """Exported inline runtime (ThreadPool::run, gemm, their per-thread flags) let two model
    libraries in one process bind to each other's copies; a training step then re-entered the
    pool on the thread holding its lock and hung (seen in CI). Only rc_<hash>_* symbols may be
    exported."""
    if engine == "clad":
        request.getfixturevalue("clad")  # skips, with the reason, where Clad is absent
    cm = rootclad.compile(mixed_model(), example_input=mixed_batch(2)[0], engine=engine)
    out = subprocess.run(["nm", "-D", "--defined-only", str(cm.library_path)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert names and all(n.startswith("rc_") for n in names), [
        n for n in names if not n.startswith("rc_")
    ][:5]


POOL_STRESS = r"""
#include <rootclad/parallel.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
// Each call's task marks which shares ran; every share t < n must run exactly once per call,
// whether the workers were spinning (calls back to back) or asleep (a pause between calls),
// and with several host threads calling at once.
struct Ctx { std::atomic<int> ran[8]; };
static void task(void* c, int t, int) { static_cast<Ctx*>(c)->ran[t].fetch_add(1); }
static int bad = 0;
static void calls(int seed, int count) {
  auto& pool = rootclad::ThreadPool::instance();
  for (int i = 0; i < count; ++i) {
    Ctx c;
    for (auto& r : c.ran) r.store(0);
    const int n = 1 + (i * 7 + seed) % pool.size();
    pool.run(task, &c, n);
    for (int t = 0; t < 8; ++t)
      if (c.ran[t].load() != (t < n ? 1 : 0)) ++bad;
    if (i % 50 == 49)  // longer than the workers spin: they go to sleep
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}
int main() {
  std::printf("pool %d\n", rootclad::ThreadPool::instance().size());
  calls(0, 2000);
  std::vector<std::thread> host;
  for (int s = 1; s <= 3; ++s) host.emplace_back(calls, s, 1000);
  for (auto& h : host) h.join();
  std::printf("bad %d\n", bad);
  return bad != 0;
}
"""


def test_thread_pool_runs_every_share_once(tmp_path):
    """parallel.h's pool: workers spin for the next call, then sleep; a worker that missed a
    call must never run it late, nor twice. A pool of 4 on any machine, so that calls with
    fewer shares than workers occur."""
    from rootclad.toolchain import find_cxx

    cxx, _ = find_cxx()
    src, exe = tmp_path / "pool.cpp", tmp_path / "pool"
    src.write_text(POOL_STRESS)
    subprocess.run([cxx, "-O1", "-std=c++17", f"-I{rootclad.get_include()}", str(src), "-o",
                    str(exe), "-pthread"], check=True)  # fmt: skip
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                         env={"ROOTCLAD_NUM_THREADS": "4"})  # fmt: skip
    assert out.stdout.splitlines() == ["pool 4", "bad 0"], out.stdout + out.stderr
