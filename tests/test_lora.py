"""lora: trainable share, and the quantized bases (4-bit NF4, 8-bit LLM.int8) really stored quantized."""
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
