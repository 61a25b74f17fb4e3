"""A single run's exit code says how it ended (errors.EXIT_CODES): 0 ok, 1 failed, 2 bad input, 3 oom,
4 diverged, 5 unsupported. A sweep keeps its own rule (test_report.py): 1 only for a failed or missing job."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, TINY, run_job
from memsweep.errors import EXIT_CODES
from memsweep.run import train_loop

CASES = {
    "bad input": ["batch_size=0"],
    # 0.5 GiB more address space than the built model (memcap.py); batch 256 x 512 tokens with eager
    # attention needs several GiB
    "oom": ["hardware=cpu", "hardware.memory_gib=0.5", "batch_size=256", "max_seq_len=512", "attention=eager"],
    "diverged": ["precision=fp16", "lr=1e4", "max_steps=5"],
    "unsupported": ["hardware=cpu", "precision=tf32"],
}


def exit_of(overrides, job_dir):
    with pytest.raises(SystemExit) as stop:
        run_job(TINY + overrides, job_dir, exits=True)
    return stop.value.code


@pytest.mark.fast
def test_the_codes_are_distinct():
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES) and EXIT_CODES["ok"] == 0


@pytest.mark.parametrize("ending", sorted(CASES))
def test_each_ending_has_its_code(ending, tmp_path):
    assert exit_of(CASES[ending], tmp_path / "job") == EXIT_CODES[ending]


def test_an_error_is_failed_and_exits_1(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(train_loop, "train_and_evaluate", boom)
    assert exit_of([], tmp_path / "job") == EXIT_CODES["failed"]
    assert (tmp_path / "job" / "traceback.txt").read_text().strip().endswith("RuntimeError: boom")


def test_ok_returns_without_exiting(tmp_path):
    assert run_job(TINY + ["max_steps=1"], tmp_path / "job", exits=True)["status"] == "ok"


@pytest.mark.fast
def test_in_a_sweep_the_job_does_not_exit(tmp_path):
    assert run_job(TINY + CASES["unsupported"], tmp_path / "job", multirun=True)["status"] == "unsupported"


def test_train_py_exits_with_the_code(tmp_path):
    done = subprocess.run([sys.executable, "train.py", *TINY, *CASES["unsupported"], f"hydra.run.dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "WANDB_MODE": "offline"})
    assert done.returncode == EXIT_CODES["unsupported"], done.stdout[-1000:] + done.stderr[-1000:]


@pytest.mark.parametrize("args", [["model=nosuch"], ["-m", "model=tiny,nosuch"], ["task=classification,nosuch"]])
def test_an_unknown_group_option_is_one_line_and_exits_2(args, tmp_path):
    done = subprocess.run([sys.executable, "train.py", *args, f"hydra.run.dir={tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    group = args[-1].split("=")[0]
    assert done.returncode == EXIT_CODES["bad input"]
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"memsweep: error: {group}: 'nosuch' is not an option; allowed: ")
    assert "causal_lm" in done.stderr if group == "task" else "tiny-llama" in done.stderr
    assert not any(tmp_path.iterdir())  # refused before Hydra made the job dir


def test_group_options_leaves_what_hydra_expands():
    from memsweep.config.validate import group_options

    group_options(["model=glob(*)", "hydra/launcher=submitit_local", "lr=abc", "-m", "model=tiny,minilm",
                   "+model=tiny", "model=null"])  # none refused here: Hydra or the schema owns them
