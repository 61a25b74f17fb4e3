"""hparams_search=optuna: F1 is the objective, and a job over the memory budget is a failed trial."""
import os
import subprocess
import sys

import yaml
from conftest import ROOT, TINY

from memsweep.schema import SearchConf
from memsweep.search import objective


def _res(status="ok", peak=2**30, f1=0.8):
    return {"status": status, "memory": {"peak_bytes": peak}, "metrics": {"f1": f1}}


def test_objective_is_the_metric_within_budget_and_none_otherwise():
    assert objective(_res(), SearchConf(max_peak_gib=2.0)) == 0.8
    assert objective(_res(peak=3 * 2**30), SearchConf(max_peak_gib=2.0)) is None  # over budget
    assert objective(_res(status="oom"), SearchConf()) is None
    assert objective(_res(), SearchConf(metric="accuracy")) is None  # not measured -> no value


def test_optuna_search_runs_trials_and_reports_the_best(tmp_path):
    sweep = tmp_path / "search"
    done = subprocess.run(
        [sys.executable, "train.py", "-m", "hparams_search=optuna", "hydra.sweeper.n_trials=2", *TINY,
         "max_steps=2", "search.max_peak_gib=1.0", f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "WANDB_MODE": "offline"})
    assert done.returncode == 0, done.stderr[-2000:]
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert set(best["best_params"]) == {"lr", "batch_size"} and 0 <= best["best_value"] <= 1
    assert sorted(p.name for p in sweep.iterdir() if p.name.isdigit()) == ["0", "1"]
