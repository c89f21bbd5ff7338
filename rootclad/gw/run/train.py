"""Training stage of ``rootclad gw run``: the compiled model, batches read from the ROOT files,
and :func:`rootclad.fit` (per-epoch validation, early stopping, the best weights) with atomic
checkpoints that ``--resume`` continues from.

The shuffle of an epoch depends only on the seed and the epoch number, the network has no
dropout, and a checkpoint holds the weights, the optimizer's state and the epoch reached: a
resumed run therefore ends exactly where an uninterrupted one would (tested).
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import numpy as np
import tomllib
import torch

from rootclad.gw.run.config import RunConfig
from rootclad.paths import replacing


@dataclasses.dataclass
class TrainResult:
    cm: object  # the CompiledModel (DeviceModel on a GPU), with the best validation weights
    engine: str
    history: list[dict]  # per epoch: train_loss, val_loss, seconds, events_per_s
    best_epoch: int
    stopped_early: bool
    resumed_from: int | None
    ranks: int = 1  # data-parallel ranks (cluster.py)
    timings: list[dict] | None = None  # per rank: compute, all-reduce and update seconds


def batches(files, cfg: RunConfig, **kwargs):
    """The C++ reader when ROOT is there, else uproot's (both give the same batches)."""
    try:
        from rootclad.data.cling import import_root

        import_root()
        from rootclad.data.compiled import CompiledBatchIterator as cls
    except ImportError:
        from rootclad.data import BatchIterator as cls
    return cls([str(f) for f in files], seed=cfg.seed, **kwargs)


def simulation_config(cfg: RunConfig, split: str):
    """The :class:`~rootclad.gw.dataset.SimulationConfig` of a split (what its file stores; a
    training on fresh events has no training file)."""
    from rootclad.gw.dataset import SimulationConfig

    kwargs = cfg.simulation(split)
    del kwargs["n_events"], kwargs["compression"]
    return SimulationConfig(**kwargs)


def compile_model(cfg: RunConfig):
    import rootclad
    from rootclad.gw.models import make

    n = round(cfg.duration * cfg.sample_rate)
    torch.manual_seed(cfg.seed)
    net = make(cfg.model, n)
    shape = (1, n) if cfg.model == "mlp" else (1, 1, n)
    return rootclad.compile(net, example_input=torch.zeros(shape), loss="bce_with_logits",
                            engine=cfg.engine, device=cfg.device)  # fmt: skip


def _shape(cfg, x):
    return x.reshape(x.shape[0], -1) if cfg.model == "mlp" else x


def _tensor(cm, a: np.ndarray) -> torch.Tensor:
    """A batch on the model's device (a CompiledModel's is the CPU; a DeviceModel's a GPU)."""
    return torch.from_numpy(a).to(cm.device, non_blocking=True)


def validation_loss(cm, it, cfg) -> float:
    """The mean loss of the validation batches (rootclad.fit's evaluate)."""
    from rootclad.torch.fit import evaluate

    return evaluate(cm, it, transform=lambda x: _shape(cfg, x))


def _save_checkpoint(path: Path, state: dict) -> None:
    with replacing(path) as tmp:
        torch.save(state, tmp)


def _same_training(a: str, b: str) -> bool:
    """Whether two run configurations (TOML text) train the same model: the data files'
    compression does not change their events, nor does a background study after the report
    change the training, and a checkpoint resumes on any number of ranks (a checkpoint from
    before these were keys has none)."""
    try:
        first, second = tomllib.loads(str(a)), tomllib.loads(str(b))
    except (ValueError, RecursionError):  # TOMLDecodeError; nesting past Python's stack
        return False
    for c in (first, second):
        for key in ("compression", "background_segments", "workers", "scheduler"):
            c.pop(key, None)
        for key, value in _NEWER_KEYS.items():  # a checkpoint from before these keys
            c.setdefault(key, value)
    return first == second


# keys added after checkpoints were written, and the value that training had
_NEWER_KEYS = {
    "training_data": "file",
    "curriculum_epochs": 0,
    "hard_negatives": 0,
    "hard_pool": 65536,
    "hard_mining": "pool",
    "select": "loss",
    "val_noise": 32768,
    "lr_schedule": "constant",
}


def load_checkpoint(path: Path, map_location=None) -> dict:
    """A checkpoint's tensors, numbers, strings and containers; anything else in the pickle
    (which could run code when unpickled: the file may come from someone else) is refused.
    What gw run itself reads is checked: a dict whose ``config`` is TOML text and whose
    ``epoch`` is a whole number >= 0 (rootclad.fit checks the rest when it resumes). A file
    that is none of this raises ValueError naming it."""
    try:
        state = torch.load(path, weights_only=True, map_location=map_location)
    except OSError:
        raise  # names the file and the cause already
    except pickle.UnpicklingError as err:
        # torch's message: a paragraph on weights_only, then the line naming what was refused
        why = next((line for line in str(err).splitlines() if "GLOBAL" in line), None)
        if why is None:
            raise ValueError(f"{path}: not a checkpoint (no pickle of tensors)") from None
        raise ValueError(
            f"{path}: refused, it holds more than tensors, numbers, strings and containers ({why})"
        ) from None
    except Exception as err:  # torn or not a checkpoint: torch's reader says why, at length
        first = str(err).split(". ")[0].splitlines()[0] if str(err) else "cut short"
        why = f"{type(err).__name__}: {first[:120]}"
        raise ValueError(f"{path}: not a readable checkpoint ({why})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not a checkpoint (it holds a {type(state).__name__})")
    try:
        tomllib.loads(state.get("config"))
    except (TypeError, ValueError, RecursionError):
        raise ValueError(f"{path}: its config is not a run configuration's TOML") from None
    epoch = state.get("epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        got = "none" if epoch is None else repr(epoch)[:40]
        raise ValueError(f"{path}: its epoch must be a whole number >= 0, got {got}")
    return state


def resume_state(cfg: RunConfig, ckpt: Path, resume: bool, log) -> dict | None:
    """The checkpoint to continue from (None: start afresh), refused when another
    configuration wrote it or it cannot be read."""
    if not (resume and ckpt.exists()):
        return None
    try:
        state = load_checkpoint(ckpt)
    except ValueError as err:
        raise ValueError(f"{err}; remove it or run without --resume") from None
    if not _same_training(state["config"], cfg.to_toml()):
        raise ValueError(
            f"{ckpt}: written by a run with another configuration; remove it or run without "
            "--resume"
        )
    log(f"resuming after epoch {state['epoch']} from {ckpt}")
    return state


def train(cfg: RunConfig, train_file, val_file, out: Path, *, resume: bool = False,
          progress: bool | None = None, log=print) -> TrainResult:  # fmt: skip
    """rootclad.fit with the run's settings: the validation loss after each epoch, early
    stopping after ``patience`` epochs without a better one, the best weights kept, and after
    each epoch (its log line first) a checkpoint, which ``resume`` continues from."""
    import rootclad
    from rootclad.gw.run import fresh
    from rootclad.torch.fit import fit

    cm = compile_model(cfg)
    opt = rootclad.optim.Adam(cm, lr=cfg.lr)
    sim = simulation_config(cfg, "train")
    score = lambda x: scores(cm, cfg, x)  # noqa: E731
    miner = None
    if cfg.training_data == "fresh":
        miner = fresh.hard_miner(cfg, sim, score) if cfg.hard_negatives else None
        tr = fresh.FreshBatches(cfg, sim, miner)
    else:
        tr = batches([train_file], cfg, batch_size=cfg.batch_size)
    if cfg.select == "pauc":
        validation = fresh.pauc_validation(cfg, sim, val_file, score)
        said = log
        log = lambda line: said(line.replace("validation loss", "validation 1 - pAUC"))  # noqa: E731
    else:
        va = batches([val_file], cfg, batch_size=1024, shuffle=False)
        validation = lambda: validation_loss(cm, va, cfg)  # noqa: E731
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint.pt"
    state = resume_state(cfg, ckpt, resume, log)

    kept = cfg.hard_mining == "carry"  # the carried hard negatives' seeds resume with it
    assert miner is not None or not kept, "config.check: carry needs hard_negatives"
    if kept and state is not None:
        miner.kept = fresh.carried_seeds(cfg, state, ckpt)

    def save(s) -> None:
        extra = {"hard_kept": torch.from_numpy(miner.kept)} if kept else {}
        _save_checkpoint(ckpt, {"config": cfg.to_toml(), **s.checkpoint(), **extra})

    # the shape and the device transfer are fit's; on a GPU the loss stays there until the
    # epoch ends (or the bar reads it, every 20 batches)
    result = fit(
        cm,
        opt,
        tr,
        epochs=cfg.epochs,
        validation=validation,
        patience=cfg.patience,
        transform=lambda x: _shape(cfg, x),
        progress=progress,
        log=log,
        on_epoch_end=save,
        resume=state,
        scheduler=lr_scheduler(cfg, opt),
    )
    return TrainResult(cm, cm.engine, result.history, result.best_epoch, result.stopped_early,
                       result.resumed_from)  # fmt: skip


def lr_scheduler(cfg: RunConfig, opt):
    """The configured ``lr_schedule`` on ``opt`` (None: constant)."""
    sched = torch.optim.lr_scheduler
    if cfg.lr_schedule == "plateau":
        return sched.ReduceLROnPlateau(opt, factor=0.5, patience=2)
    if cfg.lr_schedule == "cosine":
        return sched.CosineAnnealingLR(opt, T_max=cfg.epochs)
    return None


def scores(cm, cfg, x: np.ndarray, batch: int = 1024) -> np.ndarray:
    """The network's logit per event (x (E, 1, n) float32)."""
    out = np.empty(len(x), dtype=np.float64)
    for lo in range(0, len(x), batch):
        xb = _tensor(cm, _shape(cfg, np.ascontiguousarray(x[lo : lo + batch])))
        out[lo : lo + len(xb)] = cm.predict(xb)[:, 0].double().cpu().numpy()
    return out


def saliency(cm, cfg, x: np.ndarray) -> np.ndarray:
    """d logit / d strain for each event of x (k, 1, n), through the compiled backward."""
    xt = _tensor(cm, _shape(cfg, np.ascontiguousarray(x))).clone().requires_grad_(True)
    cm.eval()
    (grad,) = torch.autograd.grad(cm(xt).sum(), xt)
    return grad.reshape(len(x), -1).cpu().numpy()
