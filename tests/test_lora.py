"""lora: trainable share, and the quantized bases (4-bit NF4, 8-bit LLM.int8) really stored quantized."""
import pytest
import torch

from conftest import TINY, build_job


def test_lora_r8_trains_under_one_percent_of_the_minilm(tmp_path):
    from conftest import run_job

    res = run_job(["model=minilm", "lora=r8", "data.train_size=64", "data.eval_size=32", "logger=none",
                   "max_steps=2"], tmp_path)
    eff = res["effective"]
    assert res["status"] == "ok" and eff["lora_modules"] == 18  # query, key, value x 6 layers
    assert eff["trainable_params"] / eff["total_params"] < 0.01
    assert res["memory"]["optimizer_bytes"] < 0.02 * 2 * 4 * eff["total_params"]


@pytest.mark.fast
def test_lora_r16_has_twice_the_adapter_parameters_of_r8(tmp_path):
    def adapters(option):
        model = build_job(TINY + [f"lora={option}"], tmp_path / option).trainer.model
        return sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)

    assert adapters("r16") == 2 * adapters("r8")


def test_qlora_stores_the_base_linear_weights_in_4_bit_and_trains(tiny_job):
    res = tiny_job("lora=qlora", "max_steps=2")
    assert res["status"] == "ok", res["reason"]
    assert "uint8" in res["effective"]["param_dtypes"] and res["effective"]["lora_modules"] == 6


def test_int8_base_trains_and_the_audit_shows_int8_storage(tiny_job):
    res = tiny_job("lora=int8", "max_steps=2")
    assert res["status"] == "ok", res["reason"]
    assert "int8" in res["effective"]["param_dtypes"] and res["effective"]["lora_modules"] == 6


def test_qlora_and_int8_quantize_every_attention_and_dense_layer(tmp_path):
    import bitsandbytes as bnb

    for option, layer_type in (("qlora", bnb.nn.Linear4bit), ("int8", bnb.nn.Linear8bitLt)):
        model = build_job(TINY + [f"lora={option}"], tmp_path / option).trainer.model
        quantized = [m for m in model.modules() if isinstance(m, layer_type)]
        assert len(quantized) == 2 * 6  # q, k, v, attention output, intermediate, output in 2 layers
        assert all(m.weight.dtype in (torch.uint8, torch.int8) for m in quantized)
        assert not isinstance(model.base_model.model.classifier.original_module, layer_type)


def test_qlora_double_quantizes_its_block_scales_and_computes_in_the_precisions_dtype(tmp_path):
    import bitsandbytes as bnb

    def layers(*options):
        model = build_job(TINY + ["lora=qlora", *options], tmp_path.joinpath(*options)).trainer.model
        return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]

    def scale_bytes(layer):
        state = layer.weight.quant_state
        nested = state.state2.absmax.nbytes + state.offset.nbytes if state.nested else 0
        return state.absmax.nbytes + nested

    plain, double = layers("lora.double_quant=false"), layers("lora.double_quant=true")
    assert not any(m.weight.quant_state.nested for m in plain) and all(m.weight.quant_state.nested for m in double)
    # an fp32 scale per 64 weights, against an 8-bit one plus an fp32 scale per 256 of those and an offset
    weights = sum(m.weight.quant_state.shape.numel() for m in plain)
    assert sum(map(scale_bytes, plain)) == 4 * weights // 64
    assert sum(map(scale_bytes, double)) < 0.3 * sum(map(scale_bytes, plain))
    assert {m.compute_dtype for m in plain} == {torch.float32}  # the tiny job's precision: fp32
    assert {m.compute_dtype for m in layers("precision=bf16_true")} == {torch.bfloat16}


def test_double_quantization_trains_and_applies_to_4_bit_weights_only(tiny_job):
    import pytest

    from conftest import job_of
    from memsweep.config import validate
    from memsweep.errors import ConfigError

    res = tiny_job("lora=qlora", "lora.double_quant=true", "max_steps=2")
    assert res["status"] == "ok", res["reason"]
    job, _ = job_of(TINY + ["lora=int8", "lora.double_quant=true"])
    with pytest.raises(ConfigError, match=r"lora.double_quant.*NF4 weights only.*lora.quantize=int8"):
        validate.ranges(job)


def test_adapters_of_a_bf16_model_stay_fp32_unless_autocast_adapter_dtype_is_off(tmp_path):
    from conftest import run_job

    def job(*options):
        res = run_job(TINY + ["lora=r8", "precision=bf16_true", "max_steps=2", *options], tmp_path.joinpath(*options))
        assert res["status"] == "ok", res["reason"]
        return res

    cast, kept = job(), job("lora.autocast_adapter_dtype=false")
    adapters = cast["effective"]["param_dtypes"]["float32"]  # q, k, v of 2 layers (64 wide), in fp32
    assert adapters == 2 * 3 * 8 * (64 + 64) and "float32" not in kept["effective"]["param_dtypes"]
    assert kept["effective"]["trainable_params"] == cast["effective"]["trainable_params"]
    # each adapter weight in 2 bytes instead of 4, and AdamW's two states with it
    assert cast["memory"]["params_bytes"] - kept["memory"]["params_bytes"] == 2 * adapters
    assert cast["memory"]["optimizer_bytes"] - kept["memory"]["optimizer_bytes"] == 2 * 2 * adapters
