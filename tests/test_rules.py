"""The rule table: each combination that cannot run ends as `unsupported` with its reason, before any work."""
import pytest

from conftest import TINY, job_of, run_job
from memsweep.errors import Unsupported
from memsweep.techniques import rules

CASES = {
    "qlora-with-fsdp1": ["lora=qlora", "fsdp=full_shard", "fsdp.version=1"],
    "bf16-unsupported": ["hardware=t4", "precision=bf16"],
    "tf32-unsupported": ["hardware=cpu", "precision=tf32"],
    "no-gpu": ["hardware=a100_40gb"],
    "flash-attention": ["attention=flash_attention_2"],
    "quantized-with-deepspeed": ["lora=qlora", "deepspeed=zero2"],
    "8bit-optim-with-zero": ["optim=adamw_8bit", "deepspeed=zero1"],
    "offload-needs-adam": ["optim=sgd", "deepspeed=zero2_offload"],
    "deepspeed-cpu-fp16": ["precision=fp16", "deepspeed=zero2"],
    "deepspeed-bf16-true": ["precision=bf16_true", "deepspeed=zero2"],
    "fp64-with-bitsandbytes": ["precision=fp64", "lora=qlora"],
    "activation-offload-on-cpu": ["offload=activations"],
    "optimizer-offload-on-one-process": ["offload=optimizer", "distributed.nproc=2"],
    "gradient-offload-with-accumulation": ["offload=optimizer_and_grads", "accumulation=x4"],
    "optimizer-offload-with-loss-scaling": ["offload=optimizer", "precision=fp16"],
    "optimizer-offload-needs-a-gpu": ["offload=optimizer"],
    "deepspeed-with-fsdp": ["deepspeed=zero2", "fsdp=full_shard"],
    "fsdp-offload-on-cpu": ["fsdp=full_shard_offload"],
    "8bit-optim-with-fsdp": ["optim=adamw_8bit", "fsdp=full_shard"],
    "adafactor-with-fsdp": ["optim=adafactor", "fsdp=shard_grad_op"],
    "int8-with-fsdp": ["lora=int8", "fsdp=full_shard"],
}
NEEDS_A_MISSING_PIECE = {"bitsandbytes-missing", "torchao-missing", "offload-needs-cpu-adam-op"}


@pytest.mark.fast
def test_every_rule_has_a_case():
    assert {r.name for r in rules.RULES} == set(CASES) | NEEDS_A_MISSING_PIECE


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_refuses_with_its_reason(tmp_path, name):
    res = run_job(TINY + CASES[name], tmp_path)
    rule = next(r for r in rules.RULES if r.name == name)
    assert res["status"] == "unsupported"
    assert res["reason"] == f"{name}: {rule.reason}"
    assert res["time"]["train_s"] is None  # refused before any training


@pytest.mark.fast
def test_fp64_meets_bitsandbytes_optimizers_only_where_their_kernels_take_it():
    # bitsandbytes' CPU optimizer steps fp64 gradients; its CUDA kernels (backends/cuda/ops.py) take fp32/fp16/bf16
    rules.refuse_unsupported(*job_of(TINY + ["precision=fp64", "optim=adamw_8bit", "hardware=cpu"]))
    with pytest.raises(Unsupported, match="^fp64-with-bitsandbytes"):
        rules.refuse_unsupported(*job_of(TINY + ["precision=fp64", "optim=adamw_8bit", "hardware=a100_40gb"]),
                                 skip=("no-gpu",))


def test_missing_bitsandbytes_refuses_quantized_lora(tmp_path, monkeypatch):
    monkeypatch.setattr(rules, "_installed", lambda module: module != "bitsandbytes")
    res = run_job(TINY + ["lora=qlora"], tmp_path)
    assert res["status"] == "unsupported" and res["reason"].startswith("bitsandbytes-missing")


def test_missing_torchao_refuses_its_low_bit_optimizers_only(tmp_path, monkeypatch):
    monkeypatch.setattr(rules, "_installed", lambda module: module != "torchao")
    for optim in ("adamw_torch_8bit", "adamw_torch_4bit"):
        with pytest.raises(Unsupported, match="^torchao-missing"):
            rules.refuse_unsupported(*job_of(TINY + [f"optim={optim}"]))
    rules.refuse_unsupported(*job_of(TINY + ["optim=adamw_8bit"]))  # bitsandbytes' 8-bit AdamW needs no torchao


def test_offload_where_the_cpu_adam_op_cannot_be_had_is_refused(tmp_path, monkeypatch):
    assert rules._ds_op_available("cpu_adam")  # prebuilt, or built on first use: ninja and c++ are here
    monkeypatch.setattr(rules, "_ds_op_available", lambda op: False)
    res = run_job(TINY + ["deepspeed=zero2_offload"], tmp_path)
    assert res["status"] == "unsupported" and res["reason"].startswith("offload-needs-cpu-adam-op")


def test_a_sweep_goes_on_after_an_unsupported_job(tmp_path):
    refused = run_job(TINY + ["precision=tf32", "hardware=cpu"], tmp_path / "a")
    fine = run_job(TINY + ["max_steps=1"], tmp_path / "b")
    assert (refused["status"], fine["status"]) == ("unsupported", "ok")
