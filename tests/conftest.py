"""Shared test set-up: pinned threads, W&B offline inside tmp dirs, and real Hydra composition."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

# Torch threads per test process: the 2 cores shared by pytest-xdist's workers (`make test` runs two),
# so a busy machine or a parallel run never oversubscribes them.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, 2 // WORKERS)

# Before torch or wandb are imported: same behaviour on a busy machine, nothing written under ~.
os.environ["OMP_NUM_THREADS"] = str(THREADS)
os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("WANDB_SILENT", "true")
os.environ["HF_HUB_OFFLINE"] = "1"  # tests never reach the hub; hub code is tested on local data
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(THREADS)

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import open_dict  # noqa: E402

from memsweep.config.schema import register_configs  # noqa: E402

register_configs()

# A tiny, fast job: small random BERT, a few hundred tweets, no W&B unless a test asks.
TINY = ["model=tiny", "data.train_size=256", "data.eval_size=100", "logger=none", f"threads={THREADS}"]


def compose_config(overrides=(), job_dir: Path | None = None, multirun: bool = False):
    """Compose conf/config.yaml exactly as train.py does; set HydraConfig so the job can read it."""
    from hydra.types import RunMode

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN if multirun else RunMode.RUN
    if job_dir is not None:
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(job_dir)
            cfg.hydra.run.dir = str(job_dir)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def job_of(overrides):
    """The typed job config of the overrides and its hardware profile, as the estimator takes them."""
    from omegaconf import OmegaConf

    from memsweep.config import hardware

    job = OmegaConf.to_object(compose_config(overrides))
    return job, hardware.detect(job.hardware)


def run_job(overrides, job_dir: Path, multirun: bool = False, exits: bool = False) -> dict:
    """Run one real job in this process (as Hydra's basic launcher does) and return its results, also
    when a single run ends otherwise than ok and exits with its status's code (`exits=True`: the
    SystemExit is raised to the test instead)."""
    from memsweep.app.job import run
    from memsweep.run import results

    try:
        return run(compose_config(overrides, job_dir, multirun))
    except SystemExit:
        if exits:
            raise
        return results.read(job_dir / results.RESULTS_FILE)


@pytest.hookimpl(trylast=True)  # after -m / -k / --deselect chose the items, by their own node ids
def pytest_collection_modifyitems(config, items):
    """The modules that hold `slow` tests first, each kept whole (its module fixture then runs once), so that
    pytest-xdist's workers start the long tests early and end on short ones, not one worker on a long test
    while the other waits; skip the `gpu` tests on a machine without CUDA (collected and reported as
    skipped, not hidden)."""
    slow_modules = {item.module for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.module not in slow_modules)  # stable: the order within stays
    if getattr(config.option, "loadgroup", False):  # set in an xdist worker under --dist loadgroup
        group_by_node_id(items)
    if torch.cuda.is_available():
        return
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU; torch.cuda.is_available() is False")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(no_gpu)


def group_by_node_id(items):
    """Append `@<group>` to the node id of each item marked xdist_group, as pytest-xdist 3.8 means to: its
    loadgroup scheduler sends the items of one group to one worker by that suffix. xdist writes it to
    `item._nodeid`, which pytest 9.2 no longer reads (node ids are structured, `item._id`), so without this
    every group is split over the workers and each worker runs the group's module fixture again
    (pytest-xdist issue #1386). A no-op where xdist's own suffix took effect."""
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)


@pytest.fixture
def tiny_job(tmp_path):
    def _run(*overrides, job_dir=None):
        return run_job(TINY + list(overrides), job_dir or tmp_path / "job")

    return _run


def build_job(overrides, job_dir: Path):
    """The real, built job (trainer, data, ledger) for a composed config, without running it."""
    from omegaconf import OmegaConf

    from memsweep.config import hardware
    from memsweep.run.train_loop import build

    job = OmegaConf.to_object(compose_config(overrides, job_dir))
    return build(job, hardware.detect(job.hardware), job_dir)


def train_logging_every_step(overrides, job_dir: Path):
    """Build and train a job, logging every step: (the logged losses, the built job, still to be
    released by the caller; released here if training raises)."""
    from memsweep.run.train_loop import release

    built = build_job(overrides, job_dir)
    built.trainer.args.logging_steps = 1
    try:
        built.trainer.train()
    except BaseException:
        release(built)
        raise
    return [h["loss"] for h in built.trainer.state.log_history if "loss" in h], built


def status(res: dict) -> tuple[str, str]:
    return res["status"], res["reason"] or ""


@pytest.fixture(scope="session")
def checks_imported():
    """The libraries the input checks use (transformers' configs, model classes and schedulers, peft),
    imported once by one full check of an encoder and a decoder job: the timing of a refusal then measures
    the checks, as in a sweep's later jobs, not the process's first imports."""
    from memsweep.run import inputs

    for overrides in (TINY, TINY + ["model=tiny-llama", "task=causal_lm"]):
        inputs.job(compose_config(overrides))


@pytest.fixture
def no_work(monkeypatch, checks_imported):
    """Nothing is loaded, trained, estimated, planned or launched: bad input is refused before any of it."""
    from memsweep.estimate import core
    from memsweep.planner import search
    from memsweep.run import launch, model, train_loop

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the input was refused")

    # the estimate CLI imports run_estimate from core where it estimates (after the libraries are quieted)
    for owner, name in ((model, "load_model"), (train_loop, "train_and_evaluate"), (core, "run_estimate"),
                        (search, "search"), (launch, "run_ranks")):
        monkeypatch.setattr(owner, name, refuse)
