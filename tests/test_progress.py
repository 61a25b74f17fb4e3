"""What a job and a sweep print while they run: plain lines in a log, a bar in a terminal, `job k/N`
with the sweep's ETA, and one line per W&B run instead of wandb's own console block."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, THREADS, TINY, run_job
from memsweep.measure import eta, progress

# Tiny jobs with enough steps and eval batches that printing every one would exceed a line per tenth.
MANY_STEPS = ["batch_size=4", "data.train_size=80", "data.eval_size=48", "eval_batch_size=4", "max_seq_len=32",
              "measure.estimate=false", "measure.ledger=false"]
LINE = re.compile(r"^\[memsweep\] (train|eval) (\d+)/(\d+) (steps|batches)(, loss [0-9.]+)?, (.*)$")
# What wandb 0.31 prints around a run when left to itself (init banner, finish block).
WANDB_BLOCK = ("Tracking run with wandb", "W&B syncing is set to", "Run data is saved locally", "wandb leet",
               "Run history:", "Run summary:", "You can sync this run", "wandb sync", "Find logs at",
               "View run", "Syncing run", "View project")


def phase_lines(out: str, phase: str) -> list[re.Match]:
    return [m for line in out.splitlines() if (m := LINE.match(line)) and m.group(1) == phase]


def test_not_in_a_terminal_each_phase_prints_a_few_plain_lines_with_an_eta(tmp_path, capsys):
    res = run_job(TINY + MANY_STEPS, tmp_path / "job")  # progress=auto; captured stderr is no terminal
    assert res["status"] == "ok", res["reason"]
    out, err = capsys.readouterr()
    assert "\r" not in out + err  # no bar redrawing itself in a log
    assert "{'train_runtime'" not in out and "Loading weights" not in err  # Trainer's and transformers' own
    for phase, total in (("train", res["time"]["optimizer_steps"]), ("eval", 12)):
        lines = phase_lines(out, phase)
        assert int(lines[-1].group(3)) == total >= 12, out  # more steps/batches than lines allowed
        # one line per tenth of the phase at most, plus the last: fewer than one per step/batch
        assert 2 <= len(lines) <= 11, out
        assert all(re.fullmatch(r".+ elapsed, ETA .+", m.group(6)) for m in lines[:-1]), out
        assert lines[-1].group(2) == lines[-1].group(3) and lines[-1].group(6).startswith("done in "), out
    assert phase_lines(out, "train")[-1].group(5) == f", loss {res['metrics']['train_loss']:.4g}"
    assert out.index("[memsweep] eval") < out.index(f"[memsweep] {','.join(res['overrides'])}: ok")


def test_in_a_terminal_each_phase_is_a_tqdm_bar(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    res = run_job(TINY + MANY_STEPS, tmp_path / "job")
    assert res["status"] == "ok", res["reason"]
    out, err = capsys.readouterr()
    assert not phase_lines(out, "train") and not phase_lines(out, "eval")
    steps = res["time"]["optimizer_steps"]
    assert re.search(rf"\rtrain: 100%\|.*\| {steps}/{steps} \[[^]]*step[^]]*, loss=", err), err[-600:]
    assert re.search(r"\reval: 100%\|.*\| 12/12 \[", err), err[-600:]
    assert "{'train_runtime'" not in out


def test_plain_lines_are_bounded_by_tenths_and_by_time(capsys, monkeypatch):
    shown = progress.Lines("train", 1000)
    for step in range(1, 1001):
        shown.update(step, loss=0.5)
    shown.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 10 and lines[0].startswith("[memsweep] train 100/1000 steps, loss 0.5, ")
    monkeypatch.setattr(progress, "LINE_AT_LEAST_EVERY_S", 0.0)  # a slow phase: a line whenever time is up
    shown = progress.Lines("eval", 1000)
    for step in range(1, 6):
        shown.update(step)
    assert len(capsys.readouterr().out.splitlines()) == 5


@pytest.mark.fast
def test_durations_read_as_a_person_says_them():
    assert [eta.duration(s) for s in (0.04, 12.34, 59.96, 192.4, 3725)] == [
        "0.0 s", "12.3 s", "1 min 00 s", "3 min 12 s", "1 h 02 min"]
    assert eta.remaining(0, 10, 5.0) is None and eta.remaining(4, 10, 8.0) == pytest.approx(12.0)


@pytest.mark.fast
def test_a_sweeps_size_and_eta_come_from_its_grid_and_its_finished_jobs(capsys, tmp_path):
    from omegaconf import OmegaConf

    from memsweep.app.callbacks import JobProgress
    from memsweep.sweep import sweepdir

    basic_sweeper = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
    basic = OmegaConf.create({"hydra": {"sweeper": {"_target_": basic_sweeper, "params": {"optim": "adamw,sgd"}},
                                        "overrides": {"task": ["seed=1,2", "model=tiny"]}}})
    assert sweepdir.size(basic) == 4
    optuna = OmegaConf.create({"hydra": {"sweeper": {"_target_": "x.OptunaSweeper", "n_trials": 12}}})
    assert sweepdir.size(optuna) == 12
    announce = JobProgress()
    announce.on_multirun_start(basic)
    announce.durations = [10.0, 20.0]  # two jobs done: 15 s each on average, jobs 3 and 4 left
    overrides = ["seed=1", "model=tiny", "optim=sgd"]
    job = OmegaConf.create({"progress": "auto", "hydra": {"job": {"num": 2}, "overrides": {"task": overrides},
                                                          "runtime": {"output_dir": str(tmp_path)}}})
    announce.on_job_start(job)
    assert capsys.readouterr().out == "[memsweep] job 3/4: seed=1,model=tiny,optim=sgd (ETA for the sweep: 30.0 s)\n"
    (tmp_path / "results.json").write_text("{}")  # the job ran and wrote its results
    announce.on_job_end(job)
    assert len(announce.durations) == 3
    # a job a resume skips (its results written before it started) adds no duration of ~0 s to the mean
    os.utime(tmp_path / "results.json", (0, 0))
    announce.on_job_start(job)
    announce.on_job_end(job)
    assert len(announce.durations) == 3
    capsys.readouterr()
    job.progress = "none"
    announce.on_job_start(job)
    assert capsys.readouterr().out == ""


def run_train_py(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SILENT"}  # wandb as a user has it
    return subprocess.run([sys.executable, "train.py", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**env, "WANDB_MODE": "offline"})


# `False`: Hydra's sweeper spells a job's booleans so.
SMALL = ["model=tiny", "data.train_size=64", "data.eval_size=20", "max_seq_len=32", "measure.estimate=False",
         f"threads={THREADS}"]


def test_a_sweep_says_job_k_of_n_before_each_job_with_the_sweeps_eta(tmp_path):
    done = run_train_py("-m", "seed=1,2", *SMALL, "logger=none", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert done.returncode == 0, done.stderr[-2000:]
    starts = [line for line in done.stdout.splitlines() if line.startswith("[memsweep] job ")]
    name = ",".join(SMALL + ["logger=none"])
    assert starts[0] == f"[memsweep] job 1/2: seed=1,{name}"  # nothing done yet: no ETA
    assert re.fullmatch(rf"\[memsweep\] job 2/2: seed=2,{re.escape(name)} \(ETA for the sweep: (\d+ min )?[0-9.]+ s\)",
                        starts[1]), starts
    assert len(starts) == 2


def test_a_wandb_job_prints_one_line_for_its_run_and_not_wandbs_block(tmp_path):
    done = run_train_py(*SMALL, "logger=wandb", f"hydra.run.dir={tmp_path / 'job'}")
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stdout.splitlines() if line.startswith("[memsweep] W&B run: ")]
    assert len(said) == 1, done.stdout
    run_dir = said[0].removeprefix("[memsweep] W&B run: ").split(" (offline;")[0]
    assert os.path.isdir(run_dir) and run_dir.startswith(str(tmp_path / "job" / "wandb" / "offline-run-"))
    printed = done.stdout + done.stderr
    assert not [text for text in WANDB_BLOCK if text in printed], printed[-3000:]
    assert done.stdout.rstrip().endswith(said[0])  # after the job's summary
