"""Stopping is a result too: SIGINT (Ctrl-C), SIGTERM and the cluster's USR2 end a job `interrupted` at
the next safe point, with its results.json, W&B run and exit code (130, 143); a stopped sweep starts no
further job, writes its summary and resumes to completion.

Signals are sent as a terminal and a cluster send them: to the process group of a process started in a
session of its own (a shell's background job ignores SIGINT, so it would prove nothing), or, in this
process, to itself from inside the phase being tested.
"""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY, run_job
from memsweep.errors import EXIT_CODES, KEPT_ON_RESUME, STATUSES, Interrupted, exit_code, interrupted, outcome
from memsweep.run import results, stopping, train_loop, trainer
from memsweep.sweep import resume, sweepdir
from wandb_records import find_run_file, records, run_contents

ENV = {**os.environ, "WANDB_MODE": "offline"}
WITH_WANDB = [o for o in TINY if o != "logger=none"]
# 100 small steps (2-5 s on 2 quiet cores): a signal at the first progress line (step 10) lands mid-training
LONG = ["max_steps=100", "batch_size=8", "progress=lines"]


@pytest.fixture(autouse=True)
def ctrl_c_reaches_this_process():
    """SIGINT as in a terminal's foreground process (a test runner's worker may have it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# --- the ending: status, reason, exit code ----------------------------------------------------------

def test_a_stop_is_its_own_status_with_the_signals_exit_code():
    exc = Interrupted(signal.SIGTERM, "at optimizer step 3 of 10")
    assert outcome(exc) == ("interrupted", "SIGTERM at optimizer step 3 of 10")
    assert exit_code("interrupted", "SIGINT at optimizer step 3 of 10") == 130
    assert exit_code("interrupted", str(exc)) == 143
    assert 130 not in EXIT_CODES.values() and "interrupted" in STATUSES and "not started" in STATUSES
    assert "interrupted" not in KEPT_ON_RESUME and "not started" not in KEPT_ON_RESUME
    # a rank's recorded reason maps back to the same signal (launch.run_ranks)
    again = interrupted("rank 1: SIGTERM during training")
    assert (again.signum, str(again)) == (signal.SIGTERM, "SIGTERM during training (rank 1)")
    assert str(interrupted(str(exc))) == str(exc)


def test_the_handler_raises_where_interruptible_and_only_records_where_deferred():
    with stopping.handling():
        with pytest.raises(Interrupted, match="^SIGTERM while loading$"):
            with stopping.interruptible("while loading"):
                os.kill(os.getpid(), signal.SIGTERM)
        assert stopping.requested() == signal.SIGTERM
        with pytest.raises(Interrupted):  # once asked for, every later phase refuses to begin
            with stopping.interruptible("during evaluation"):
                pass
    assert stopping.requested() is None
    with stopping.handling():
        with stopping.deferred():
            os.kill(os.getpid(), signal.SIGINT)  # Trainer's loop: recorded, the step goes on
        assert stopping.requested() == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # pytest's own handler is back


class _SignalsWhenCollected:
    def __del__(self):  # where Python cannot raise: an exception here is only printed, "ignored"
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_landing_where_python_cannot_raise_still_stops_the_block_with_no_traceback(monkeypatch):
    printed = []
    monkeypatch.setattr(sys, "unraisablehook", printed.append)  # what Python would print, "ignored"
    started = time.monotonic()
    with stopping.handling():
        with pytest.raises(Interrupted, match="^SIGTERM while loading$"):
            with stopping.interruptible("while loading"):
                _SignalsWhenCollected()  # collected at once: the handler runs inside __del__
                while time.monotonic() - started < 5:  # the block goes on only until the stop comes again
                    pass
        assert stopping.requested() == signal.SIGTERM
    assert time.monotonic() - started < 1 and printed == [] and sys.unraisablehook == printed.append


def test_an_ignored_sigint_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a shell's background job
    try:
        with stopping.handling():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, previous)


SECOND_CTRL_C = """
import os, signal, sys, time
from memsweep.run import stopping
stopping.install()
with stopping.deferred():
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)  # a launcher's copy of the same Ctrl-C: ignored
    print("still running", flush=True)
    time.sleep(stopping.SAME_CTRL_C_S + 0.2)
    os.kill(os.getpid(), signal.SIGINT)  # a person's second Ctrl-C
    time.sleep(30)
print("not reached")
"""


def test_a_second_ctrl_c_ends_the_process_at_once():
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SECOND_CTRL_C], capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 130 and time.monotonic() - started < 20
    assert "still running" in done.stdout and "not reached" not in done.stdout
    assert "Ctrl-C again: ending at once" in done.stderr


# --- one job, in this process -------------------------------------------------------------------------

def test_training_stops_at_the_end_of_the_optimizer_step_in_progress(tmp_path, monkeypatch):
    def ctrl_c_as_step_4_begins(self, args, state, control, **kwargs):
        if state.global_step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(trainer.StopCallback, "on_step_begin", ctrl_c_as_step_4_begins, raising=False)
    with pytest.raises(SystemExit) as stop:
        run_job(TINY + ["max_steps=40"], tmp_path / "job", exits=True)
    assert stop.value.code == 130
    res = results.read(tmp_path / "job" / "results.json")
    assert res["status"] == "interrupted"
    assert res["reason"].startswith("SIGINT at optimizer step 4 of 40, after ")
    assert "memory ledger of step 2" in res["reason"] and res["reason"].endswith("not evaluated")
    # what it measured is kept: 4 steps, their loss and time, the ledger of step 2; no evaluation
    assert res["time"]["optimizer_steps"] == 4 and res["time"]["train_s"] > 0
    assert res["metrics"]["train_loss"] > 0 and res["metrics"]["f1"] is None
    assert res["memory"]["peak_bytes"] > 0 and res["memory"]["ledger_step"] == 2
    assert res["effective"]["optimizer_state_bytes"] > 0


def test_a_stop_during_evaluation_ends_the_job_at_once(tmp_path, monkeypatch):
    def evaluate_until_sigterm(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the handler raises before this line")

    monkeypatch.setattr(train_loop.task, "evaluate", evaluate_until_sigterm)
    res = run_job(TINY + ["max_steps=8"], tmp_path / "job")
    assert res["status"] == "interrupted" and exit_code(res["status"], res["reason"]) == 143
    assert res["reason"].startswith("SIGTERM during evaluation, after training 8 optimizer steps (train loss ")
    assert res["metrics"]["train_loss"] > 0 and res["time"]["optimizer_steps"] == 8


def test_mode_estimate_is_stopped_too(tmp_path, monkeypatch):
    from memsweep.estimate import core

    def estimate_until_ctrl_c(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("the handler raises before this line")

    monkeypatch.setattr(core, "run_estimate", estimate_until_ctrl_c)
    res = run_job(TINY + ["mode=estimate"], tmp_path / "job")
    assert (res["status"], res["reason"]) == ("interrupted", "SIGINT during the estimate")


def test_a_worker_told_to_stop_records_its_next_job_not_started(tmp_path):
    stopping.install()  # as the sweep's callback does in a launcher's worker
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # between two jobs: recorded
        res = run_job(TINY, tmp_path / "job", multirun=True)
    finally:
        stopping.uninstall()
    assert res["status"] == "not started" and "SIGTERM" in res["reason"]
    assert results.read(tmp_path / "job" / "results.json")["status"] == "not started"
    assert not (tmp_path / "job" / "wandb").exists()  # nothing ran


@pytest.mark.fast
@pytest.mark.parametrize("status", STATUSES)
def test_resume_keeps_measurements_and_runs_stopped_jobs_again(status, tmp_path):
    results.write(tmp_path / "results.json", {"status": status, "config_hash": "abc"})
    kept = resume.completed(tmp_path, "abc")
    assert (kept is not None) == (status in ("ok", "oom", "unsupported", "diverged"))


def test_the_estimate_cli_stops_after_the_estimate_in_progress(tmp_path, monkeypatch):
    from memsweep.app import estimate as cli
    from memsweep.estimate import core  # the CLI imports run_estimate from it where it estimates

    calls = []

    def second_one_interrupted(job, profile, job_dir, memo=None):
        calls.append(job_dir)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(job, profile, job_dir, memo)

    real = core.run_estimate
    monkeypatch.setattr(core, "run_estimate", second_one_interrupted)
    assert cli.main(["model=tiny", "batch_size=8,16,32,64", "--out", str(tmp_path)]) == 130
    assert len(calls) == 2  # the third and fourth never began
    jobs = sweepdir.collect(tmp_path)
    assert [j.status for j in jobs] == ["ok", "interrupted", "not started", "not started"]
    assert jobs[1].reason == "SIGINT during the estimate"
    table = (tmp_path / "estimate.md").read_text()
    assert "interrupted: SIGINT during the estimate" in table and table.count("not started") == 2


# --- launchers ---------------------------------------------------------------------------------------

def launcher(name):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={name}"], return_hydra_config=True)
    return cfg.hydra.launcher, instantiate(cfg.hydra.launcher)


@pytest.mark.parametrize("name", ["local", "slurm"])
def test_a_submitit_job_is_checkpointed_as_a_delayed_submission_of_the_same_job(name):
    from submitit.helpers import DelayedSubmission

    _, plugin = launcher(name)
    args = (["optim=sgd"], "hydra.sweep.dir", 3, "job_id_for_3", {})
    again = plugin.checkpoint(*args)  # what submitit calls on USR2 before it requeues
    assert isinstance(again, DelayedSubmission) and again.function is plugin and again.args == args


def test_the_slurm_launcher_requeues_timed_out_jobs_and_signals_ahead():
    cfg, _ = launcher("slurm")
    assert cfg.signal_delay_s == 120 and cfg.max_num_timeout == 3 and cfg.timeout_min == 120


def test_a_stopped_sweep_whose_job_was_killed_still_ends_with_its_summary(monkeypatch):
    from submitit.core.utils import UncompletedJobError

    def killed(self, job_overrides, initial_job_idx):
        raise UncompletedJobError("Job 1 has not produced any output (state: INTERRUPTED)")

    _, plugin = launcher("local")
    # the plugin's own LocalLauncher, as this class derives from it (Hydra's plugin scan may re-import it)
    monkeypatch.setattr(type(plugin).__bases__[-1], "launch", killed)
    with pytest.raises(UncompletedJobError):  # not stopped: submitit's error, as before
        plugin.launch([["optim=sgd"]], 0)
    with stopping.handling():
        os.kill(os.getpid(), signal.SIGTERM)
        assert plugin.launch([["optim=sgd"]], 0) == []  # the summary reads the sweep dir instead


# --- in subprocesses, as a person or a cluster stops them --------------------------------------------

class Started:
    """A command in a session of its own (its own process group, SIGINT not ignored), its output
    collected as it comes; `signal_when` sends a signal to the group once a line or a file shows."""

    def __init__(self, args, cwd=ROOT):
        self.proc = subprocess.Popen(args, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def signal_when(self, shown, signum, timeout_s=600, to=None) -> float:
        """Poll until `shown(output)`, then signal the group (or the process `to()` names); when it was sent."""
        deadline = time.monotonic() + timeout_s
        while not shown(self.output):
            assert self.proc.poll() is None, f"ended before the signal:\n{self.output[-3000:]}"
            assert time.monotonic() < deadline, self.output[-3000:]
            time.sleep(0.05)
        sent = time.time()
        if to is None:
            os.killpg(self.proc.pid, signum)
        else:
            os.kill(to(), signum)
        return sent

    def wait(self, timeout_s=600) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)

    @property
    def output(self) -> str:
        return "".join(self.lines)


def training(output: str) -> bool:
    return "[memsweep] train " in output


@pytest.mark.slow  # a real job in a subprocess
@pytest.mark.parametrize("signum, code, more", [
    (signal.SIGINT, 130, []),
    # SIGTERM with DataLoader workers: they get the group's SIGTERM too (killed, torch would fail the job
    # first), so this case covers a plain SIGTERM and the workers at once
    (signal.SIGTERM, 143, ["dataloader=fast"]),
])
def test_a_job_stopped_mid_training_ends_interrupted_within_seconds(signum, code, more, tmp_path):
    job_dir = tmp_path / "job"
    job = Started([sys.executable, "train.py", *WITH_WANDB, *LONG, *more, f"hydra.run.dir={job_dir}"])
    sent = job.signal_when(training, signum)
    assert job.wait() == code, job.output[-3000:]
    written_after = (job_dir / "results.json").stat().st_mtime - sent
    name = signal.Signals(signum).name
    print(f"\n{name} {' '.join(more)}: results.json written {written_after:.2f} s after the signal")
    assert written_after < 10
    res = results.read(job_dir / "results.json")
    assert res["status"] == "interrupted" and res["reason"].startswith(f"{name} at optimizer step")
    assert 10 <= res["time"]["optimizer_steps"] < 100 and res["metrics"]["train_loss"] > 0
    assert "Traceback" not in job.output and f": interrupted ({res['reason']})" in job.output
    # the W&B run is finished, marked with the status and the signal's exit code
    run_file = find_run_file(job_dir)
    assert run_contents(run_file)["summary"]["status"] == "interrupted"
    assert [r.exit.exit_code for r in records(run_file) if r.WhichOneof("record_type") == "exit"] == [code]


def statuses(sweep_dir: Path, n: int) -> list:
    return [(results.read(sweep_dir / str(i) / "results.json") or {}).get("status") for i in range(n)]


@pytest.mark.slow  # a 2-job sweep stopped, then resumed, in subprocesses
def test_a_sweep_stopped_in_its_first_job_keeps_it_and_resumes_to_completion(tmp_path):
    sweep_dir = tmp_path / "sweep"
    sweep = Started([sys.executable, "train.py", "-m", "optim=adamw,sgd", *WITH_WANDB, *LONG,
                     f"hydra.sweep.dir={sweep_dir}"])
    sweep.signal_when(training, signal.SIGINT)
    assert sweep.wait() == 130, sweep.output[-3000:]
    assert "job 2/2" not in sweep.output and not (sweep_dir / "1").exists()  # stopped before job 2 began
    assert statuses(sweep_dir, 2) == ["interrupted", None]
    summary = (sweep_dir / "summary.md").read_text()
    assert "# Sweep summary: 2 jobs (1 interrupted, 1 not started)" in summary
    assert "**interrupted** — SIGINT at optimizer step" in summary and summary.count("**not started**") == 1
    assert "resume it with: python -m memsweep.resume" in sweep.output

    resumed = subprocess.run([sys.executable, "-m", "memsweep.resume", str(sweep_dir)], cwd=ROOT, env=ENV,
                             capture_output=True, text=True, timeout=1200)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert statuses(sweep_dir, 2) == ["ok", "ok"]
    assert "2 jobs (2 ok)" in (sweep_dir / "summary.md").read_text()
    # nothing twice: one result and one W&B run per job, the interrupted attempt set aside, one summary run
    for i in range(2):
        assert len(list((sweep_dir / str(i)).glob("wandb/offline-run-*"))) == 1
    assert results.read(sweep_dir / "0" / "attempts" / "1" / "results.json")["status"] == "interrupted"
    assert not (sweep_dir / "1" / "attempts").exists()
    assert len(list(sweep_dir.glob("wandb/offline-run-*"))) == 1

    # and once complete, resuming again runs nothing
    done = [(sweep_dir / str(i) / "results.json").stat().st_mtime_ns for i in range(2)]
    again = subprocess.run([sys.executable, "-m", "memsweep.resume", str(sweep_dir), "logger=none"], cwd=ROOT,
                           env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count("skipped (done: ok") == 2, again.stdout[-3000:]
    assert [(sweep_dir / str(i) / "results.json").stat().st_mtime_ns for i in range(2)] == done


@pytest.mark.slow  # joblib's two workers in a subprocess
def test_a_parallel_sweep_stops_its_running_jobs_and_starts_no_other(tmp_path):
    sweep_dir = tmp_path / "sweep"
    one_thread = [o for o in TINY if not o.startswith("threads=")] + ["threads=1"]
    sweep = Started([sys.executable, "train.py", "-m", "hydra/launcher=parallel", "optim=adamw,sgd,adafactor",
                     *one_thread, *LONG, f"hydra.sweep.dir={sweep_dir}"])
    sweep.signal_when(lambda out: out.count("[memsweep] train ") >= 2, signal.SIGINT)  # both workers training
    assert sweep.wait() == 130, sweep.output[-3000:]
    assert statuses(sweep_dir, 3) == ["interrupted", "interrupted", "not started"]
    assert "# Sweep summary: 3 jobs (2 interrupted, 1 not started)" in (sweep_dir / "summary.md").read_text()
    assert not (sweep_dir / "2" / "wandb").exists() and "Traceback" not in sweep.output


def task_pid(sweep_dir: Path) -> int:
    """The process submitit's local controller started for the sweep's job (as Slurm would on a node)."""
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_text()
        except OSError:
            continue
        if "submitit.core._submit" in command and str(sweep_dir) in command:
            return int(entry.name)
    raise AssertionError("no submitit task found")


@pytest.mark.slow  # submitit's local executor, its job stopped, requeued and run again
def test_submitit_requeues_a_job_the_cluster_signals_and_it_then_completes(tmp_path):
    sweep_dir = tmp_path / "sweep"
    sweep = Started([sys.executable, "train.py", "-m", "hydra/launcher=local", "optim=sgd", *TINY,
                     *LONG, f"hydra.sweep.dir={sweep_dir}"])

    def logs() -> str:
        return "".join(p.read_text() for p in sweep_dir.glob(".submitit/*/*_log.out"))

    # USR2 to the job's process, as Slurm sends it signal_delay_s before the time limit or on preemption
    sweep.signal_when(lambda _: training(logs()), signal.SIGUSR2, to=lambda: task_pid(sweep_dir))
    assert sweep.wait() == 0, sweep.output[-3000:]
    first = results.read(sweep_dir / "0" / "attempts" / "1" / "results.json")
    assert first["status"] == "interrupted" and first["reason"].startswith("SIGUSR2 at optimizer step")
    assert statuses(sweep_dir, 1) == ["ok"]
    assert "Requeued job" in logs() and "1 jobs (1 ok)" in (sweep_dir / "summary.md").read_text()
