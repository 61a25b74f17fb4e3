"""What memsweep itself adds to each training step, counted inside one run instead of timed across processes.

Two runs on a shared machine differ by more than the overhead targets, so this counts directly: memsweep's
own Python code per step (self time under cProfile, an upper bound), the W&B writer's CPU seconds, and the
calls into torch's memory and module trackers after the memory-ledger step (hooks left installed).
The job is the default one (`python train.py` with `max_steps`). Writes one JSON object to --out.

Method: docs/guide/benchmarks.md.
"""
import argparse
import cProfile
import json
import os
import pstats
import tempfile
import time
from pathlib import Path

import psutil
from transformers import TrainerCallback

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = str(ROOT / "src" / "memsweep")
TRACKERS = ("/torch/distributed/_tools/", "/torch/utils/module_tracker.py")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=25, help="optimizer steps of the job")
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    p.add_argument("--override", action="append", default=[], help="one more train.py override (repeatable)")
    p.add_argument("--out", required=True)
    return p.parse_args()


def compose_job(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from memsweep.config.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return cfg, OmegaConf.to_object(cfg)


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's child processes: W&B's writer."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


class Window(TrainerCallback):
    """Profiles from the end of the ledger step to the end of training: every later step whole
    (batches, forward, backward, optimizer, callbacks, logging). Added last, so the ledger callback
    has closed its step first."""

    def __init__(self, after_step: int):
        self.after_step = after_step
        self.profiler = cProfile.Profile()
        self.started = self.first_step = self.wandb_cpu_start = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.after_step:
            self.start(state.global_step)

    def start(self, step: int) -> None:
        self.first_step, self.wandb_cpu_start = step, children_cpu_s()
        self.started = time.perf_counter()
        self.profiler.enable()

    def stop(self, last_step: int) -> dict:
        self.profiler.disable()
        wall = time.perf_counter() - self.started
        return {"steps": last_step - self.first_step, "wall_s": wall,
                "wandb_cpu_s": children_cpu_s() - self.wandb_cpu_start}


def own_functions(profiler: cProfile.Profile, steps: int) -> dict:
    """Self seconds of memsweep's functions in the profile, the largest ones per step, and the calls
    into torch's trackers."""
    stats = pstats.Stats(profiler).stats
    own = {(file, line, name): (calls, self_s)
           for (file, line, name), (_, calls, self_s, _, _) in stats.items() if file.startswith(PACKAGE)}
    rows = [{"function": f"{Path(file).name}:{line} {name}", "calls_per_step": calls / steps,
             "self_ms_per_step": 1e3 * self_s / steps} for (file, line, name), (calls, self_s) in own.items()]
    rows.sort(key=lambda r: -r["self_ms_per_step"])
    tracker_calls = {f"{Path(file).name}:{line} {name}": calls
                     for (file, line, name), (_, calls, _, _, _) in stats.items() if any(t in file for t in TRACKERS)}
    return {"own_s": sum(self_s for _, self_s in own.values()), "top_functions": rows[:8],
            "tracker_calls": tracker_calls}


def main() -> None:
    args = parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from omegaconf import OmegaConf

    from memsweep.config import hardware
    from memsweep.run.train_loop import build, release
    from memsweep.sweep import wandb_log

    overrides = [f"max_steps={args.steps}", *args.override]
    cfg, job = compose_job(overrides)
    profile = hardware.detect(job.hardware)
    with tempfile.TemporaryDirectory(prefix="memsweep-own-cost-") as tmp:
        job_dir = Path(tmp)
        run = wandb_log.start(job.logger, job_dir, group="own_cost", name=",".join(overrides), job_type="train",
                              config=OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), tags=[])
        built = build(job, profile, job_dir, run)
        ledger_step = built.ledger.step if job.measure.ledger else 1
        window = Window(after_step=ledger_step)
        built.trainer.add_callback(window)
        try:
            built.trainer.train()
            measured = window.stop(built.trainer.state.global_step)
        finally:
            release(built)
            wandb_log.finish(run, {})
    own = own_functions(window.profiler, measured["steps"])
    steps, wall = measured["steps"], measured["wall_s"]
    result = {"overrides": overrides, "threads": torch.get_num_threads(), "cores": os.cpu_count(),
              "steps": steps, "step_s": wall / steps, "own_s_per_step": own["own_s"] / steps,
              "own_share": own["own_s"] / wall, "tracker_calls": own["tracker_calls"],
              "wandb_enabled": run is not None, "wandb_cpu_s": measured["wandb_cpu_s"],
              "wandb_cpu_share_of_machine": measured["wandb_cpu_s"] / (wall * os.cpu_count()),
              "top_functions": own["top_functions"]}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
