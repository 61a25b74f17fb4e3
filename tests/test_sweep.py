"""Real sweeps, each in a subprocess as a user runs them: failure isolation, kill -9 and resume,
submitit's launcher. Tiny jobs (a few seconds each); one training process at a time except where
submitit starts its two jobs together (one thread each)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from conftest import ROOT, THREADS, TINY, run_job
from memsweep.run import results
from memsweep.sweep import report, sweepdir
from wandb_records import find_run_file, run_contents

ENV = {**os.environ, "WANDB_MODE": "offline"}
WITH_WANDB = [o for o in TINY if o != "logger=none"]

# One case per way a job can end, as configs appended to the defaults (`+case=...`): appended, they
# override everything config.yaml sets. The job before the OOM starts torch's threads uncapped.
CASES = {
    "ok": "seed: 1\n",
    # 0.5 GiB more address space; batch 256 x 512 tokens with eager attention needs several GiB
    "oom": "hardware: {memory_gib: 0.5}\nbatch_size: 256\nmax_seq_len: 512\nattention: {implementation: eager}\n",
    # LoRA on modules the model does not have: bad input, refused before the model is built (the checks
    # read its module names off the meta model); a failed job like any error
    "failed": "defaults:\n  - override /lora: r8\nlora: {target_modules: [no_such_module]}\n",
    # fp16 with a huge step: the loss is NaN by the first logged step (16 steps; Trainer logs every 10;
    # short sequences because fp16 autocast is slow on a CPU)
    "diverged": "defaults:\n  - override /precision: fp16\nlr: 1.0e4\nbatch_size: 16\nmax_seq_len: 16\n",
    "unsupported": "defaults:\n  - override /precision: tf32\n",  # no TF32 on a CPU: the rule refuses it
}


def write_cases(conf: Path) -> Path:
    (conf / "case").mkdir(parents=True)
    for name, body in CASES.items():
        (conf / "case" / f"{name}.yaml").write_text("# @package _global_\n" + body)
    return conf


def run_sweep(args, sweep_dir: Path, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", "-m", *args, f"hydra.sweep.dir={sweep_dir}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=ENV)


def statuses(sweep_dir: Path, n: int) -> list:
    return [(results.read(sweep_dir / str(i) / "results.json") or {}).get("status") for i in range(n)]


@pytest.mark.slow  # a five-job sweep in a subprocess
def test_oom_divergence_error_and_refusal_in_one_sweep_every_job_a_result(tmp_path):
    conf, sweep_dir = write_cases(tmp_path / "conf"), tmp_path / "sweep"
    done = run_sweep(["+case=ok,oom,failed,diverged,unsupported", *WITH_WANDB, f"hydra.searchpath=[file://{conf}]"],
                     sweep_dir)
    # the sweep ran to its end and wrote the summary; a `failed` job (an error) makes it exit 1
    assert done.returncode == 1, done.stderr[-3000:]
    assert statuses(sweep_dir, 5) == ["ok", "oom", "failed", "diverged", "unsupported"]
    reasons = [results.read(sweep_dir / str(i) / "results.json")["reason"] for i in range(5)]
    assert "can't allocate memory" in reasons[1]  # a real allocation failure under the cap
    assert reasons[2].startswith("bad input: lora.target_modules: 'no_such_module' is not a module of model=tiny")
    assert not (sweep_dir / "2" / "traceback.txt").exists()  # bad input is its one line, not a traceback
    assert reasons[3].startswith("loss became NaN/inf") and reasons[4].startswith("tf32-unsupported")

    # every job is one finished W&B run of the sweep's group; the summary run joins them
    group = str(sweep_dir).strip("/").replace("/", "_")
    for i, status in enumerate(["ok", "oom", "failed", "diverged", "unsupported"]):
        run = run_contents(find_run_file(sweep_dir / str(i)))
        assert (run["run"].run_group, run["run"].job_type, run["summary"]["status"]) == (group, "train", status)
    summary_run = run_contents(find_run_file(sweep_dir))
    assert (summary_run["run"].run_group, summary_run["run"].job_type) == (group, "summary")
    assert summary_run["summary"]["jobs.oom"] == 1 and summary_run["summary"]["memory/_type"] == "image-file"

    md = (sweep_dir / "summary.md").read_text()
    assert "5 jobs (1 ok, 1 oom, 1 unsupported, 1 diverged, 1 failed)" in md
    for i, status in enumerate(["oom", "failed", "diverged", "unsupported"], start=1):
        assert f"): **{status}** — {reasons[i]}" in md
    assert md.split("\n| #")[1].split("\n\n")[0] in done.stdout  # the table is printed at the end
    assert "1 job(s) failed or left no result: 2 (failed)" in done.stdout
    assert all((sweep_dir / name).stat().st_size > 0 for name in report.FILES)


@pytest.mark.slow  # a sweep, killed and resumed, in subprocesses
def test_a_sweep_killed_mid_job_resumes_with_every_job_done_once(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = ["data.train_size=256,300,200", *(o for o in WITH_WANDB if not o.startswith("data.train_size="))]
    proc = subprocess.Popen([sys.executable, "train.py", "-m", *args, f"hydra.sweep.dir={sweep_dir}"], cwd=ROOT,
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        # job 1 has opened its W&B run: it still has its data to load, its model to build and train
        while not list(sweep_dir.glob("1/wandb/offline-run-*")):
            assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended before job 1 started"
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and every process it started (W&B's service)
        proc.wait()
    assert statuses(sweep_dir, 3) == ["ok", None, None], "job 1 finished before the kill: test inconclusive"

    # an interrupted sweep can be summarised: the lost jobs are listed, not dropped
    assert report.main([str(sweep_dir)]) == 0
    killed = sweepdir.collect(sweep_dir)
    assert [(j.status, j.reason.split(":")[0] if j.reason else None) for j in killed] == [
        ("ok", None), ("missing", "no complete results.json"), ("not started", "the job never started")]

    job0 = sweep_dir / "0" / "results.json"
    before = (job0.read_bytes(), job0.stat().st_mtime_ns)
    resumed = subprocess.run([sys.executable, "-m", "memsweep.resume", str(sweep_dir)], cwd=ROOT, env=ENV,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "data.train_size=256,300,200" in resumed.stdout and "skipped (done: ok" in resumed.stdout
    assert (job0.read_bytes(), job0.stat().st_mtime_ns) == before  # done once, not again
    assert statuses(sweep_dir, 3) == ["ok", "ok", "ok"]
    assert [results.read(sweep_dir / str(i) / "results.json")["data"]["train_examples"] for i in range(3)] == \
        [256, 300, 200]

    # one W&B run per job: the killed attempt's run is set aside, so `make wandb-sync` skips it
    for i in range(3):
        assert len(list((sweep_dir / str(i)).glob("wandb/offline-run-*"))) == 1
    assert len(list((sweep_dir / "1" / "attempts" / "1").glob("wandb/offline-run-*"))) == 1
    groups = {run_contents(find_run_file(sweep_dir / str(i)))["run"].run_group for i in range(3)}
    summary_run = run_contents(find_run_file(sweep_dir))["run"]
    assert groups == {summary_run.run_group} and summary_run.job_type == "summary"
    assert [j.status for j in sweepdir.collect(sweep_dir)] == ["ok", "ok", "ok"]
    assert "3 jobs (3 ok)" in (sweep_dir / "summary.md").read_text()


@pytest.mark.slow  # a sweep through submitit, then the job again here
def test_submitit_local_runs_a_two_job_sweep_with_the_results_of_the_basic_launcher(tmp_path):
    one_thread = [o for o in TINY if not o.startswith("threads=")] + ["threads=1"]  # both jobs run at once
    sweep_dir = tmp_path / "sweep"
    done = run_sweep(["hydra/launcher=local", "seed=1,2", *one_thread], sweep_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert statuses(sweep_dir, 2) == ["ok", "ok"]
    # submitit's local job ids are the ids of the processes it started: one per job
    assert len({p.parent.name for p in sweep_dir.glob(".submitit/*/*_log.out")}) == 2
    assert "2 jobs (2 ok)" in (sweep_dir / "summary.md").read_text()

    # the same job in this process (as the basic launcher runs it) gives the same results, except
    # what belongs to the process and the clock
    try:
        reference = run_job(one_thread + ["seed=1"], tmp_path / "reference")
    finally:
        torch.set_num_threads(THREADS)
    remote = results.read(sweep_dir / "0" / "results.json")
    for res in (reference, remote):
        res.pop("time")
        for key in ("process_peak_rss", "cuda_max_allocated", "cuda_max_reserved"):
            res["memory"].pop(key)
        res["estimate"].pop("seconds"), res["estimate"]["trace"].pop("seconds")  # how long the estimate took
        # on a CPU the roofline's rates are this process's own, measured at its start-up (roofline.py)
        for key in ("step_time_s", "predicted_step_s", "tokens_per_s", "step_time"):
            res["estimate"].pop(key)
        res["estimate"]["at_data"].pop("step_s")  # (the data's typical length stays: the same data)
        res.pop("wandb_group")  # each sweep dir is its own group
    assert sorted(remote.pop("overrides")) == sorted(reference.pop("overrides"))
    assert remote == reference


@pytest.mark.parametrize("launcher, keys", [
    ("parallel", {"n_jobs": 2}),
    ("local", {"timeout_min": 60}),
    ("slurm", {"partition": None, "nodes": 1, "tasks_per_node": 1, "gpus_per_node": 1, "timeout_min": 120,
               "array_parallelism": 16}),
    ("ray", {"ray": {"init": {"address": None}, "remote": {"num_cpus": 1}}}),
])
def test_launcher_configs_compose_with_their_documented_keys(launcher, keys):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert {k: cfg.hydra.launcher[k] for k in keys} == keys
    assert cfg.hydra.launcher._target_.startswith("hydra_plugins.")


@pytest.mark.slow  # a local Ray instance, and a two-job sweep in a subprocess
def test_ray_runs_a_two_job_sweep_on_a_local_ray_instance(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="the `ray` extra is not installed")
    one_thread = [o for o in TINY if not o.startswith("threads=")] + ["threads=1"]  # both jobs may run at once
    sweep_dir = tmp_path / "sweep"
    done = run_sweep(["hydra/launcher=ray", "optim=adamw,sgd", *one_thread, "max_steps=2",
                      "+hydra.launcher.ray.init.include_dashboard=false"], sweep_dir, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Started a local Ray instance" in done.stderr + done.stdout
    assert "(_run_job pid=" in done.stderr + done.stdout  # the jobs printed from Ray's workers
    assert statuses(sweep_dir, 2) == ["ok", "ok"]
    assert "2 jobs (2 ok)" in (sweep_dir / "summary.md").read_text()


@pytest.mark.fast
def test_resume_refuses_a_dir_that_is_not_a_sweep_in_one_line_and_runs_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-m", "memsweep.resume", str(tmp_path)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr  # bad input
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("memsweep: error: sweep_dir: ")
    assert f"{tmp_path} is not a sweep dir" in done.stderr, done.stderr
    assert "python -m memsweep.resume multirun/" in done.stderr  # the usage, to try again
    assert not any(tmp_path.iterdir())  # no job started
