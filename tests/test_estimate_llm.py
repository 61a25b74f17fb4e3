"""make estimate-llm in small: a decoder's technique combinations estimated once per device and set
against each GPU in one table (python -m memsweep.app.estimate --grid ... --by hardware), and the one-line
messages for a model or architecture that does not exist."""
import json

import pytest

from conftest import job_of
from memsweep.app import estimate as cli
from memsweep.errors import ConfigError
from memsweep.estimate import core
from memsweep.estimate.meta import model_config, traced_model
from memsweep.run.setup import build_setup
from memsweep.sweep import estimates, sweepdir

GIB = 2**30


@pytest.mark.fast
def test_the_grids_are_a_union_each_job_once():
    jobs = cli.jobs_of(["task=causal_lm", "hardware=t4,rtx4090"],
                       [["precision=bf16_true", "lora=none,r8"], ["precision=bf16_true", "lora=r8"]])
    assert len(jobs) == 4 and len({tuple(j) for j in jobs}) == 4
    assert cli.jobs_of(["precision=fp32,bf16"], None) == [["precision=fp32"], ["precision=bf16"]]


def test_llama_combinations_per_gpu(tmp_path, capsys):
    out = tmp_path / "llm"
    code = cli.main(["task=causal_lm", "model=llama-3.2-1b", "batch_size=1", "max_seq_len=64", "hardware=t4,rtx4090",
                     "--grid", "precision=bf16_true", "lora=none,r8", "--by", "hardware", "--out", str(out)])
    assert code == 0  # a rule's refusal (bf16 on a T4) is no failure
    printed = capsys.readouterr().out
    written = (out / "estimate-by-hardware.md").read_text()
    assert written in printed and (out / estimates.SWEEP_TABLE).is_file()
    rows = markdown_rows(written)
    parts = ("fits", "margin GiB", "used GiB", "ms/step")
    assert list(rows[0]) == ["lora", "method"] + [f"{gpu} {p}" for gpu in ("t4", "rtx4090") for p in parts]
    assert [r["lora"] for r in rows] == ["none", "r8"]
    notes = written.split("\n- ")[1:]
    assert "every row: task=causal_lm model=llama-3.2-1b batch_size=1 max_seq_len=64 precision=bf16_true" in notes
    for row in rows:  # a T4 has no bf16: the cell says so through a numbered note
        assert row["t4 fits"] == "unsupported [1]" and row["t4 used GiB"] == "-"
    assert any(n.startswith("[1] unsupported: bf16-unsupported") for n in notes)
    by_lora = {json.loads((d / sweepdir.OVERRIDES_FILE).read_text())[-1]:
               json.loads((d / sweepdir.ESTIMATE_FILE).read_text())
               for d in out.iterdir() if (d / sweepdir.ESTIMATE_FILE).is_file()}
    assert set(by_lora) == {"lora=none", "lora=r8"}
    for row in rows:
        est = by_lora[f"lora={row['lora']}"]
        assert row["method"] == "trace" == est["method"] and est["hardware"] == "rtx4090"
        # fits and the margin take "used" on the safe side of packing (the allocator's upper figure)
        used, upper = est["device_used_bytes"], est["device_used_upper_bytes"]
        assert upper >= used
        assert est["margin_bytes"] == int(23.6 * GIB) - upper and est["fits"] == (upper <= int(23.6 * GIB))
        assert row["rtx4090 fits"] == ("yes" if est["fits"] else "**no**")
        # the table's "used" is the total that must fit: the upper figure, a run's varying lengths included
        assert est["total_bytes"] == upper and row["rtx4090 used GiB"] == f"{upper / GIB:.1f}"
        assert row["rtx4090 margin GiB"] == f"{est['margin_bytes'] / GIB:+.1f}"
        assert float(row["rtx4090 ms/step"]) == pytest.approx(est["flops_per_step"] / 165.2e9, abs=0.05)
    # LoRA: a frozen base keeps no gradients or optimizer state for its weights
    assert by_lora["lora=r8"]["device_used_bytes"] < by_lora["lora=none"]["device_used_bytes"]


@pytest.mark.fast
def test_one_trace_per_device_is_exactly_the_estimate_of_each_gpu():
    common = ["task=causal_lm", "model=tiny-llama", "batch_size=2", "max_seq_len=32", "precision=fp16"]
    memo: dict = {}
    shared = [core.estimate_job(*job_of(common + [f"hardware={gpu}"]), memo=memo).to_dict()
              for gpu in ("a100_40gb", "t4")]
    assert len(memo) == 1  # the T4 reused the A100's trace
    alone = core.estimate_job(*job_of(common + ["hardware=t4"])).to_dict()
    assert without_seconds(shared[1]) == without_seconds(alone)
    assert shared[0]["peak_reserved_bytes"] == shared[1]["peak_reserved_bytes"]
    assert shared[0]["device_used_bytes"] != shared[1]["device_used_bytes"]  # each GPU's CUDA context


def without_seconds(value):
    if isinstance(value, dict):
        return {k: without_seconds(v) for k, v in value.items() if k != "seconds"}
    return value


def test_mixed_precision_keeps_fp32_weights_of_a_bf16_checkpoint():
    # the shipped Llama config says torch_dtype bfloat16, as the hub checkpoint is saved; bf16 (mixed)
    # trains fp32 master weights all the same, bf16_true trains the bf16 ones
    for precision, dtype in (("bf16", "torch.float32"), ("fp32", "torch.float32"), ("bf16_true", "torch.bfloat16")):
        job, profile = job_of(["task=causal_lm", "model=llama-3.2-1b", f"precision={precision}"])
        setup = build_setup(job, profile)
        model = traced_model(job, setup)
        assert {str(p.dtype) for p in model.parameters()} == {dtype}, precision


@pytest.mark.parametrize("overrides, key, names", [
    (["model=nosuch"], "model", ["llama-3.1-8b", "tiny-llama", "conf/model/"]),
    (["hardware=nosuch"], "hardware", ["t4", "rtx4090", "a100_40gb"]),
    (["model=llama-3.2-1b", "model.config=nosuch"], "model.config", ["llama-3.1-8b", "qwen2.5-7b", "a path"]),
    (["model=llama-3.2-1b", "model.config=null", "model.path=nosuch/model"], "model.config",
     ["model.path='nosuch/model'", "Hugging Face cache", "llama-3.2-1b,", "model.architecture"]),
])
def test_a_model_or_architecture_that_does_not_exist_is_one_line(overrides, key, names):
    with pytest.raises(ConfigError) as caught:
        job = cli.compose(["task=causal_lm"] + overrides)
        model_config(job)
    message = str(caught.value)
    assert caught.value.key == key and message.startswith(f"{key}: ") and "\n" not in message
    assert all(name in message for name in names), message


def markdown_rows(text: str) -> list[dict[str, str]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return [dict(zip(cells[0], row)) for row in cells[2:]]
