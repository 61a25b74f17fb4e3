"""make gpu-check: without a GPU it says so and runs nothing; its table puts predicted beside measured
for each counter (checked on made-up results here); on a GPU it runs the grid (gpu marker)."""
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402
from memsweep.sweep.sweepdir import SweepJob  # noqa: E402

GIB = 2**30


def test_without_a_gpu_it_says_so_and_runs_nothing(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--out", str(tmp_path / "GPU.md"),
                           "--sweeps", str(tmp_path / "sweeps")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "no CUDA GPU on this machine, nothing was run" in done.stdout
    assert not (tmp_path / "GPU.md").exists() and not (tmp_path / "sweeps").exists()


def test_the_table_puts_each_counter_beside_its_prediction():
    res = {"memory": {"cuda_max_allocated": 2 * GIB, "cuda_max_reserved": 3 * GIB, "device_used_bytes": None},
           "estimate": {"peak_allocated_bytes": int(2.2 * GIB), "peak_reserved_bytes": None,
                        "reserved_upper_bytes": int(3.3 * GIB), "predicted_step_s": 0.0625,
                        "step_time": {"ops_per_micro_batch": 1000, "ops_in_optimizer_step": 200}},
           "time": {"step_s_median": 0.125},
           "effective": {"compute_dtype": "float16", "grad_scaler": "GradScaler", "optimizer": "AdamW8bit"}}
    ok = SweepJob(0, ["precision=fp16", "optim=adamw_8bit"], "ok", res=res)
    refused = SweepJob(1, ["precision=bf16", "optim=adamw_8bit"], "unsupported", reason="bf16-unsupported: ...")
    rows = gpu_check.rows("minilm", [ok, refused])
    assert gpu_check.rows("bert-base-random", [SweepJob(2, ["model=tiny"], "ok", res=res)])[0]["model"] == \
        "bert-base-random"  # the grid's name, not its model= override
    assert rows[0]["allocated predicted GiB"] == "2.200" and rows[0]["allocated measured GiB"] == "2.000"
    assert rows[0]["allocated error"] == "+10.0 %" and rows[0]["reserved error"] == "–"  # not predicted
    assert rows[0]["used measured GiB"] == "–" and rows[0]["ms/step"] == "125.0"
    assert rows[0]["ms/step predicted"] == "62.5" and rows[0]["ops/step"] == "1200"  # the host's share of a step
    assert rows[0]["reserved upper error"] == "+10.0 %"
    assert (rows[0]["grad_scaler"], rows[0]["compute_dtype"]) == ("GradScaler", "float16")
    assert rows[1]["status"] == "unsupported" and rows[1]["reason"].startswith("bf16-unsupported")
    table = gpu_check.table(rows)
    assert table.splitlines()[0].startswith("| model") and "AdamW8bit" in table


@pytest.mark.gpu
def test_on_a_gpu_every_job_has_a_row_with_its_counters(tmp_path):
    assert gpu_check.main(["--out", str(tmp_path / "GPU.md"), "--sweeps", str(tmp_path / "sweeps")]) == 0
    text = (tmp_path / "GPU.md").read_text()
    assert text.count("| minilm") == 18 and text.count("| bert-base-random") == 18
    assert text.count("| llama-random") == 6
