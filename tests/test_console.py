"""What a person reads: library warnings go to the job log, not the console; each line once; every
answer line names the shape it answers for, in the task's units. The three commands, run as a person runs
them, print memsweep's lines only: what the libraries print as they load is in the log."""
import io
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import ROOT
from memsweep.app.job import print_summary
from memsweep.config.schema import HardwareConf
from memsweep.estimate.table import summary_line
from memsweep.measure import shapes
from memsweep.run import console, results

T4 = HardwareConf(name="t4", device="cuda", tensor_core_multiple=8)
# What marks a library's line (a warning, its source line, a kernel it could not load, torch's deprecations)
LIBRARY_MARKS = ("Warning", "warnings.warn", "Failed to load", "_pytree", "kernels-community")
TORCH_LINE = re.compile(r"^[DIWEF]\d{4} [\d:.]+ +\d+ \S+\] (?P<message>.*)$")  # torch's own handler's format


@pytest.fixture
def job_logging(tmp_path):
    """Handlers as Hydra configures a job: a console stream and the job log."""
    from transformers.utils import logging as transformers_logging

    screen, log = logging.StreamHandler(io.StringIO()), logging.FileHandler(tmp_path / "train.log")
    logging.captureWarnings(False)  # pytest put its own warning recorder back since an earlier job captured them
    root = logging.getLogger()
    level = root.level
    root.addHandler(screen)
    root.addHandler(log)
    root.setLevel(logging.INFO)
    yield screen.stream, tmp_path / "train.log"
    for handler in (screen, log):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)
    logging.captureWarnings(False)
    transformers_logging.disable_propagation()
    transformers_logging.enable_default_handler()


def test_library_warnings_go_to_the_log_and_each_line_shows_once(job_logging):
    screen, log = job_logging
    console.library_noise_to_log()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("`is_gradient_checkpointing` is deprecated", FutureWarning, stacklevel=1)
    logging.getLogger("bitsandbytes.backends.cpu.ops").warning("Failed to load CPU gemm_4bit_forward from "
                                                               "kernels-community")
    logging.getLogger("peft.tuners").warning("Some weights were not initialized")
    logging.getLogger("peft.tuners").error("a library error is shown")
    for _ in range(2):
        logging.getLogger("memsweep.app.job").warning("memsweep's own line")
    shown, kept = screen.getvalue(), log.read_text()
    assert shown.splitlines() == ["a library error is shown", "memsweep's own line"]
    for line in ("FutureWarning", "gemm_4bit_forward", "Some weights were not initialized"):
        assert line in kept and line not in shown
    assert kept.count("memsweep's own line") == 2  # the log keeps everything
    # transformers writes to stderr through a handler of its own: its records now go the same way
    transformers_logger = logging.getLogger("transformers")
    assert transformers_logger.propagate and not [h for h in transformers_logger.handlers if console._is_console(h)]


def test_calling_it_again_adds_no_second_filter(job_logging):
    screen, _ = job_logging
    console.library_noise_to_log()
    console.library_noise_to_log()
    logging.getLogger("memsweep").warning("once")
    assert screen.getvalue() == "once\n"


def test_the_answer_line_names_its_shape():
    est = {"fits": True, "step_time_s": 0.0159, "method": "trace", "hardware": "t4", "total_bytes": 9.51 * 2**30,
           "capacity_bytes": 15 * 2**30, "flops_per_step": 1.03e12, "micro_batch_size": 1, "seq_len": 1024,
           "accumulation_steps": 4, "shape_advice": None}
    assert summary_line(est).startswith("[memsweep] estimate (trace) on t4 for micro-batch 1 x 1024 tokens x 4 "
                                        "accumulation steps: 9.51 GiB of 15.00 GiB, fits")


@pytest.mark.slow  # a fresh process: what the README's QLoRA-on-a-T4 estimate prints, on the tiny Llama
def test_an_estimate_prints_its_answer_with_its_shape_and_its_advice_once(tmp_path, import_noise):
    done = subprocess.run([sys.executable, "train.py", "mode=estimate", "task=causal_lm", "model=tiny-llama",
                           "lora=qlora", "hardware=t4", "precision=fp16", "batch_size=1", "logger=none",
                           f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-2000:]
    assert "on t4 for micro-batch 1 x 64 tokens: " in done.stdout
    assert printed.count("advice: ") == 1 and printed.count("tensor cores (multiples of 8)") == 1
    assert_clean(done, tmp_path / "train.log", import_noise)
    assert "FutureWarning" in (tmp_path / "train.log").read_text()  # kept in the job log


def test_output_to_sends_fd_writes_and_prints_to_the_file_and_restores_them(tmp_path, capfd):
    log = tmp_path / "job.log"
    with pytest.raises(RuntimeError), console.output_to(log):
        os.write(2, b"from C, on fd 2\n")
        os.write(1, b"from C, on fd 1\n")
        print("a print", file=sys.__stderr__, flush=True)  # the process's stderr (pytest replaced sys.stderr)
        raise RuntimeError("an import that fails")  # still raised, the console given back
    os.write(2, b"after\n")
    assert log.read_text().splitlines() == ["from C, on fd 2", "from C, on fd 1", "a print"]
    assert capfd.readouterr().err == "after\n"


def test_an_image_estimate_and_summary_speak_of_images_and_give_no_text_advice(tmp_path, capsys):
    advice = shapes.audit(T4, 12, None, None, images=True)
    assert advice["not_multiples"] == ["micro-batch"]  # no padding, no vocabulary to flag
    assert advice["advice"] == "pick micro-batch sizes that are multiples of 8 on t4 so matmuls use tensor cores"
    est = {"fits": True, "step_time_s": 0.002, "method": "trace", "hardware": "t4", "total_bytes": 2**30,
           "capacity_bytes": 15 * 2**30, "flops_per_step": 1e10, "micro_batch_size": 12, "seq_len": 64,
           "accumulation_steps": 2, "shape_advice": advice}
    line = summary_line(est, images=True)
    assert "for micro-batch 12 images x 2 accumulation steps: 1.00 GiB" in line
    assert "token" not in line and "pad" not in line and "vocabulary" not in line
    assert "micro-batch 12 x 64 tokens x 2" in summary_line(est)  # a text task's shape is unchanged
    res = results.Result.start(["task=image_classification"], "0" * 16)
    res.end("ok", None)
    res.metrics.f1, res.metrics.accuracy, res.metrics.train_loss = 0.5, 0.6, 0.7
    res.memory.peak_bytes, res.memory.ledger_step, res.memory.ledger_seq_len = 2**20, 2, 65
    res.effective["micro_batch_size"], res.time.train_s, res.time.samples_per_s, res.time.total_s = 12, 1.0, 12.0, 2.0
    res.shape_advice = advice
    print_summary(res, tmp_path, images=True)
    out = capsys.readouterr().out
    assert "(step 2, micro-batch 12 images)" in out and "token" not in out and "pad" not in out


# --- the commands as a person runs them: memsweep's lines on the console, the libraries' in the log ---------

def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.fixture(scope="module")
def import_noise() -> list[str]:
    """What the libraries print on their own as they load, in a process that routes nothing: each message."""
    done = _run(["-c", "import " + ", ".join(console.LIBRARIES)])
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    messages = [m.group("message") if (m := TORCH_LINE.match(line)) else line for line in lines]
    assert messages, "the libraries printed nothing as they loaded: the tests below would prove nothing"
    return messages


def not_memsweeps(printed: str, *written: Path) -> list[str]:
    """The printed lines that are not memsweep's. Its own start with `[memsweep] ` or `memsweep: error: `, or
    continue one, indented; a table it printed is in the file it wrote (estimate.md, plan.md)."""
    tables = {line for path in written for line in path.read_text().splitlines()}
    return [line for line in printed.splitlines() if line.strip() and (any(mark in line for mark in LIBRARY_MARKS)
            or not (line in tables or line.startswith(("[memsweep] ", "memsweep: error: ", "  "))))]


def assert_clean(done: subprocess.CompletedProcess, log: Path, noise: list[str], *written: Path) -> None:
    """It worked, printed memsweep's lines only, and what the libraries said as they loaded is in `log`."""
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-3000:]
    assert not_memsweeps(printed, *written) == [], printed[-3000:]
    kept = log.read_text()
    for message in noise:
        assert message in kept and message not in printed, message


@pytest.mark.slow  # a training job in a fresh process
def test_a_job_prints_memsweeps_lines_only_and_the_libraries_lines_reach_the_job_log(tmp_path, import_noise):
    done = _run(["train.py", "model=tiny", "data.train_size=64", "data.eval_size=64", "logger=none",
                 f"hydra.run.dir={tmp_path}"])
    assert_clean(done, tmp_path / "train.log", import_noise)
    assert "[memsweep] train 2/2 steps" in done.stdout and f"  results: {tmp_path / 'results.json'}" in done.stdout


@pytest.mark.slow  # the estimate command line in a fresh process: a text job and an image job
def test_the_estimate_cli_prints_memsweeps_lines_only_and_an_image_job_in_images(tmp_path, import_noise):
    done = _run(["-m", "memsweep.app.estimate", "--out", str(tmp_path), "--grid", "task=causal_lm",
                 "model=tiny-llama", "lora=qlora", "hardware=t4", "precision=fp16", "batch_size=1", "--grid",
                 "task=image_classification", "model=tiny-vit", "data=digits", "hardware=t4", "batch_size=12"])
    assert_clean(done, tmp_path / "estimate.log", import_noise, tmp_path / "estimate.md")
    text_job, rest = done.stdout.split("[memsweep] #1 ")
    image_job = rest.split("\n\n")[0]  # its lines, up to the table
    assert "for micro-batch 1 x 64 tokens" in text_job and "pad the vocabulary" in text_job
    assert "for micro-batch 12 images: " in image_job, image_job
    assert "token" not in image_job and "pad" not in image_job and "vocabulary" not in image_job
    assert "  advice: pick micro-batch sizes that are multiples of 8 on t4 so matmuls use tensor cores" in image_job
    image_est = json.loads((tmp_path / "1" / "estimate.json").read_text())
    assert image_est["tokens_per_s"] is None and image_est["shape_advice"]["not_multiples"] == ["micro-batch"]


@pytest.mark.slow  # mode=plan in a fresh process, its rows searched in two worker processes
def test_a_plan_prints_memsweeps_lines_only_its_workers_included(tmp_path, import_noise):
    done = _run(["train.py", "mode=plan", "task=causal_lm", "model=tiny-llama", "plan.hardware=[t4]", "plan.depths=[]",
                 "plan.workers=2", "plan.precision=[fp16]", "plan.optim=[adamw]", "plan.checkpointing=[none]",
                 "plan.lora=[none,r8]", "plan.offload=[none]", "plan.micro_batches=[32]", "logger=none",
                 f"hydra.run.dir={tmp_path}"])
    assert_clean(done, tmp_path / "train.log", import_noise, tmp_path / "plan.md")
    assert "[memsweep] plan: 2 rows in " in done.stdout
    kept = (tmp_path / "train.log").read_text()
    assert all(kept.count(message) >= 3 for message in import_noise)  # the plan's process and its two workers
