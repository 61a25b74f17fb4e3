"""What a person reads: library warnings go to the job log, not the console; each line once; every
answer line names the shape it answers for."""
import io
import logging
import os
import subprocess
import sys
import warnings

import pytest

from conftest import ROOT
from memsweep.estimate.table import summary_line
from memsweep.run import console


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
def test_an_estimate_prints_its_answer_with_its_shape_and_its_advice_once(tmp_path):
    done = subprocess.run([sys.executable, "train.py", "mode=estimate", "task=causal_lm", "model=tiny-llama",
                           "lora=qlora", "hardware=t4", "precision=fp16", "batch_size=1", "logger=none",
                           f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-2000:]
    assert "on t4 for micro-batch 1 x 64 tokens: " in done.stdout
    assert printed.count("advice: ") == 1 and printed.count("tensor cores (multiples of 8)") == 1
    assert "Warning" not in printed and "warnings.warn" not in printed, printed
    assert "FutureWarning" in (tmp_path / "train.log").read_text()  # kept in the job log
