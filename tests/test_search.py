"""hparams_search=optuna: F1 is the objective, and a job over the memory budget is a failed trial."""
import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, TINY
from memsweep.config.schema import SearchConf
from memsweep.sweep.search import objective


def _res(status="ok", peak=2**30, f1=0.8):
    return {"status": status, "memory": {"peak_bytes": peak}, "metrics": {"f1": f1}}


@pytest.mark.fast
def test_objective_is_the_metric_within_budget_and_none_otherwise():
    assert objective(_res(), SearchConf(max_peak_gib=2.0)) == 0.8
    assert objective(_res(peak=3 * 2**30), SearchConf(max_peak_gib=2.0)) is None  # over budget
    assert objective(_res(status="oom"), SearchConf()) is None
    assert objective(_res(), SearchConf(metric="accuracy")) is None  # not measured -> no value


@pytest.mark.slow  # a sweep in a subprocess
def test_optuna_search_runs_trials_and_reports_the_best(tmp_path):
    # With seed 15 the sampler draws batch size 64, then 16 (peaks ~68 and ~35 MiB on the tiny model):
    # a 50 MiB budget fails the first trial, so exactly one trial is the best even when the F1 values
    # tie (after 2 steps the tiny model predicts the majority class). Optuna gives a tie to the first
    # trial: a search that ignored the budget would report the over-budget one.
    budget = 50 * 2**20
    sweep = tmp_path / "search"
    done = subprocess.run(
        [sys.executable, "train.py", "-m", "hparams_search=optuna", "hydra.sweeper.n_trials=2", *TINY,
         "max_steps=2", "seed=15", f"search.max_peak_gib={budget / 2**30}", f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "WANDB_MODE": "offline"})
    assert done.returncode == 0, done.stderr[-2000:]
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert sorted(p.name for p in sweep.iterdir() if p.name.isdigit()) == ["0", "1"]
    trials = [json.loads((sweep / n / "results.json").read_text()) for n in ("0", "1")]
    assert all(t["status"] == "ok" for t in trials)
    # each trial's objective, read from its own results.json: F1, or nothing when over the budget
    scores = [t["metrics"]["f1"] if t["memory"]["peak_bytes"] <= budget else None for t in trials]
    within = [n for n, score in enumerate(scores) if score is not None]
    assert within, "every trial is over the budget: nothing to report"
    assert best["best_value"] == max(scores[n] for n in within)
    winners = [n for n in within if scores[n] == best["best_value"]]
    assert len(winners) == 1, f"trials tie ({scores}): the test cannot tell whose parameters should be reported"
    # best_params are the parameters that job ran with: as Optuna set them, and as Hydra composed them
    (winner,) = winners
    overrides = dict(o.split("=", 1) for o in trials[winner]["overrides"])
    params = best["best_params"]
    assert set(params) == {"lr", "batch_size"}
    assert (float(overrides["lr"]), int(overrides["batch_size"])) == (params["lr"], params["batch_size"])
    config = yaml.safe_load((sweep / str(winner) / ".hydra" / "config.yaml").read_text())
    assert (config["lr"], config["batch_size"]) == (params["lr"], params["batch_size"])


@pytest.mark.parametrize("args, metric, direction", [
    ([], "f1", "maximize"), (["task=causal_lm"], "perplexity", "minimize"),
    (["search.metric=accuracy"], "accuracy", "maximize"), (["search.metric=eval_loss"], "eval_loss", "minimize")])
def test_the_search_optimises_the_tasks_metric_in_its_direction(args, metric, direction):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from memsweep.sweep.search import metric as metric_of
    from memsweep.sweep.search import register_resolver

    register_resolver()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hparams_search=optuna", *args], return_hydra_config=True)
    assert OmegaConf.select(cfg, "hydra.sweeper.direction") == direction
    assert metric_of(OmegaConf.to_object(cfg.search), cfg.task.name) == metric
    res = {"status": "ok", "memory": {"peak_bytes": 1}, "metrics": {metric: 0.5}}
    assert objective(res, OmegaConf.to_object(cfg.search), cfg.task.name) == 0.5


@pytest.mark.slow  # a search in a subprocess
def test_a_search_with_no_completed_trial_still_writes_the_summary_of_its_trials(tmp_path):
    # every trial over a budget of 0.0001 GiB: Optuna ends the search with an error (no best trial)
    sweep = tmp_path / "search"
    done = subprocess.run(
        [sys.executable, "train.py", "-m", "hparams_search=optuna", "hydra.sweeper.n_trials=1", *TINY, "max_steps=1",
         "search.max_peak_gib=0.0001", f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "WANDB_MODE": "offline"})
    assert done.returncode == 1, done.stderr[-2000:]
    assert "the sweep stopped before its end; summary of the jobs it ran:" in done.stdout
    assert json.loads((sweep / "0" / "results.json").read_text())["status"] == "ok"
    assert "| 0 " in (sweep / "summary.md").read_text() and (sweep / "summary.csv").exists()
