"""make validate-estimates: published rows become jobs (or say why they cannot), each prediction is
read on the source's own counter, and the errors are computed against the published figure."""
import sys

import pytest
import yaml

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import validate_estimates as ve  # noqa: E402

PUBLISHED = ROOT / "benchmarks" / "published"


def test_every_published_table_has_a_counter_and_rows_with_units():
    import yaml

    for path in sorted(PUBLISHED.glob("*.yaml")):
        table = yaml.safe_load(path.read_text())
        assert table["source"]["url"] and table["counter"], path.name
        for row in table["rows"]:
            assert row.get("memory") is None or ve.unit(row) in ve.UNIT_BYTES, (path.name, row["label"])


def test_rows_become_jobs_or_say_why_not():
    ladder = {"precision": "bf16_mixed (Fabric bf16-mixed)", "float32_matmul_precision": "highest"}
    assert "precision=bf16" in ve.job_for("rasbt_distilbert_imdb_precision", ladder, {})[0]
    tf32 = {"precision": "fp32", "float32_matmul_precision": "high"}
    assert "precision=tf32" in ve.job_for("rasbt_distilbert_imdb_precision", tf32, {})[0]
    # the table's own annotated value: fp32 matmuls as torch's default runs them, not TF32
    rows, common = published_rows("rasbt_distilbert_imdb_precision")
    assert "precision=fp32" in ve.job_for("rasbt_distilbert_imdb_precision", rows["Float32-regular"], common)[0]
    for pure in ("fp16_true", "fp64"):  # Fabric's 16-true and 64-true
        row = {"precision": f"{pure} (Fabric)"}
        assert f"precision={pure}" in ve.job_for("rasbt_distilbert_imdb_precision", row, {})[0]
    with pytest.raises(ve.NotModelled, match="fp8: no memsweep precision"):
        ve.job_for("rasbt_distilbert_imdb_precision", {"precision": "fp8 (Fabric transformer-engine)"}, {})
    assert ve.published_bytes({"memory": 5.37, "unit": "GB"}) == 5.37e9
    assert ve.published_bytes({"memory": None, "unit": "GB"}) is None


def published_rows(stem):
    import yaml

    table = yaml.safe_load((PUBLISHED / f"{stem}.yaml").read_text())
    return {row["label"]: row for row in table["rows"]}, table.get("common", {})


def test_decoder_rows_become_jobs_or_name_the_technique_memsweep_lacks():
    import re

    rows, common = published_rows("torchtune_llama32_3b_optimization_ladder")
    overrides, _ = ve.job_for("torchtune_llama32_3b_optimization_ladder", rows["+ Packed Dataset"], common)
    assert {"model=llama-3.2-3b", "batch_size=2", "max_seq_len=4096", "precision=bf16_true",
            "checkpointing=none"} <= set(overrides)
    for label, technique in (("Baseline", "data-dependent length"), ("+ Compile", "torch.compile"),
                             ("+ Chunked Cross Entropy", "chunked cross-entropy"),
                             ("+ Fuse optimizer step into backward", "optimizer step inside the backward"),
                             ("QLoRA", "torchao NF4")):
        with pytest.raises(ve.NotModelled, match=re.escape(technique)):
            ve.job_for("torchtune_llama32_3b_optimization_ladder", rows[label], common)
    rows, common = published_rows("litgpt_lora_alpaca_1xa100_40gb")
    overrides, caveat = ve.job_for("litgpt_lora_alpaca_1xa100_40gb", rows["7 B Llama 2 7B / None / micro-batch 2"],
                                   common)
    assert {"model=llama-2-7b", "hardware=a100_40gb", "accumulation.steps=64", "max_seq_len=1304", "lora=r8",
            "lora.target_modules=[q_proj,v_proj]", "optim=adamw_torch"} <= set(overrides)
    overrides, _ = ve.job_for("litgpt_lora_alpaca_1xa100_40gb", rows["1.3 B phi-1.5 / None / micro-batch 4"], common)
    assert {"model=phi-1.5", "accumulation.steps=32", "max_seq_len=1044", "lora.target_modules=[q_proj,v_proj]",
            "+model.overrides.hidden_act=gelu_pytorch_tanh"} <= set(overrides)
    overrides, caveat = ve.job_for("litgpt_lora_alpaca_1xa100_40gb", rows["3 B StableLM Alpha / None / micro-batch 1"],
                                   common)
    assert {"model=stablelm-base-alpha-3b", "lora=r8", "lora.target_modules=[query_key_value]"} <= set(overrides)
    assert "fused query_key_value" in caveat
    overrides, _ = ve.job_for("litgpt_lora_alpaca_1xa100_40gb", rows["13 B Llama 2 13B / None / micro-batch 1"], common)
    assert {"model=llama-2-13b", "accumulation.steps=128", "max_seq_len=1304"} <= set(overrides)
    with pytest.raises(ve.NotModelled, match="no shipped architecture for tiiuae/falcon-40b"):
        ve.job_for("litgpt_lora_alpaca_1xa100_40gb", rows["40 B Falcon 40B / None / micro-batch 1"], common)
    # Lightning's BitsandbytesPrecision: every linear in 4 bits, the head too; lit-gpt's PagedAdamW
    for label, double in (("7 B Llama 2 7B / bnb.nf4-dq / micro-batch 1", "true"),
                          ("7 B Llama 2 7B / bnb.nf4 / micro-batch 1", "false")):
        overrides, caveat = ve.job_for("litgpt_lora_alpaca_1xa100_40gb", rows[label], common)
        assert {"lora=qlora", "model.quantize_skip_modules=[]", "optim=paged_adamw_32bit", "precision=bf16_true",
                f"lora.double_quant={double}"} <= set(overrides) and "paged" in caveat
        assert "lora=r8" not in overrides and "optim=adamw_torch" not in overrides
    rows, common = published_rows("torchtune_llama2_7b_lora_rank_targets")
    overrides, _ = ve.job_for("torchtune_llama2_7b_lora_rank_targets", rows["all layers, rank 64"], common)
    assert {"lora.r=64", "lora.alpha=128", "checkpointing=full", "max_seq_len=512",
            "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]"} <= set(overrides)
    rows, common = published_rows("torchtitan_llama31_8b_fsdp_128xh100")
    overrides, caveat = ve.job_for("torchtitan_llama31_8b_fsdp_128xh100", rows["FSDP"], common)
    assert {"checkpointing=selective", "fsdp=full_shard", "distributed.nodes=16", "distributed.nproc=8",
            "batch_size=256", "max_seq_len=8192"} <= set(overrides) and "Accelerate" in caveat
    with pytest.raises(ve.NotModelled, match="torch.compile"):
        ve.job_for("torchtitan_llama31_8b_fsdp_128xh100", rows["FSDP + torch.compile"], common)


def test_every_published_table_has_a_mapping():
    for path in sorted(PUBLISHED.glob("*.yaml")):
        assert path.stem in ve.TABLES, path.name


@pytest.mark.slow
def test_the_bert_large_row_is_predicted_on_its_counter(capsys):
    frame = ve.check([PUBLISHED / "mscherrmann_bert_large_rtx3090.yaml"])
    row = frame.iloc[0]
    assert row["counter"] == "max_memory_allocated" and row["note"] == "trace on rtx3090"
    assert row["published GiB"] == pytest.approx(10562.79 / 1024)
    expected = 100 * (row["predicted GiB"] - row["published GiB"]) / row["published GiB"]
    assert row["error %"] == pytest.approx(expected) and abs(row["error %"]) <= ve.TOLERANCE_PCT


def test_the_vision_rows_are_vit_jobs_or_say_why_not():
    rows, common = published_rows("rasbt_vit_l16_cifar10_memory_ladder")
    overrides, caveat = ve.job_for("rasbt_vit_l16_cifar10_memory_ladder",
                                   rows["05 bf16, micro-batch 4 x accumulation 4"], common)
    assert {"task=image_classification", "model=vit-l16", "batch_size=16", "accumulation.steps=4",
            "precision=bf16_true", "optim=adamw_torch"} <= set(overrides) and "torchvision vit_l_16" in caveat
    fsdp, _ = ve.job_for("rasbt_vit_l16_cifar10_memory_ladder", rows["09 FSDP + CPU offload, 4 GPUs, fp32, "
                                                                     "activation checkpointing"], common)
    assert {"distributed.nproc=4", "fsdp=full_shard_offload", "checkpointing=full", "batch_size=256"} <= set(fsdp)
    rows, common = published_rows("torchao_low_bit_adamw_vit_h")
    assert "optim=adamw_8bit" in ve.job_for("torchao_low_bit_adamw_vit_h", rows["bnb 8-bit"], common)[0]
    for label, optim in (("ao 8-bit", "adamw_torch_8bit"), ("ao 4-bit", "adamw_torch_4bit")):
        assert f"optim={optim}" in ve.job_for("torchao_low_bit_adamw_vit_h", rows[label], common)[0]
    for label in ("ao FP8 E4M3", "lpmm 4-bit"):
        with pytest.raises(ve.NotModelled, match="torchao's FP8 AdamW and lpmm's 4-bit AdamW are not among them"):
            ve.job_for("torchao_low_bit_adamw_vit_h", rows[label], common)
    rows, common = published_rows("torchao_cpu_offload_vit_giant")
    giant, caveat = ve.job_for("torchao_cpu_offload_vit_giant", rows["None"], common)
    assert {"model=dinov2-giant", "+model.overrides.image_size=224", "batch_size=32", "precision=bf16_true",
            "optim=adamw_fused", "checkpointing=full", "hardware.memory_gib=16"} <= set(giant) \
        and "257 tokens" in caveat
    assert "offload=none" in giant
    for label, option in (("ao", "optimizer"), ("ao (offload gradients)", "optimizer_and_grads")):
        assert f"offload={option}" in ve.job_for("torchao_cpu_offload_vit_giant", rows[label], common)[0]
    zero = ve.job_for("torchao_cpu_offload_vit_giant", rows["DeepSpeed ZeRO-Offload"], common)[0]
    assert {"deepspeed=zero2_offload", "precision=bf16", "deepspeed.overlap_comm=true", "offload=none"} <= set(zero)


def test_a_table_on_an_older_torch_is_stepped_as_its_foreach_adam_was():
    import older_libraries as older

    stated = {stem: older.stated_torch(yaml.safe_load((PUBLISHED / f"{stem}.yaml").read_text())) for stem in
              ("rasbt_distilbert_imdb_precision", "rasbt_vit_l16_cifar10_memory_ladder",
               "litgpt_lora_alpaca_1xa100_40gb")}
    assert stated == {"rasbt_distilbert_imdb_precision": (2, 0, ""),
                      "rasbt_vit_l16_cifar10_memory_ladder": (2, 1, "20230623"),
                      "litgpt_lora_alpaca_1xa100_40gb": (2, 1, "")}  # 2.1.0, released after the change
    assert [older.foreach_adam_holds_denom(v) for v in stated.values()] == [True, True, False]
    assert not older.foreach_adam_holds_denom((2, 1, "20230711")) and not older.adjustments({"common": {}})
    # on a GPU profile (foreach) the older step holds one more parameter-sized list at the update; SGD is untouched
    job = ["model=tiny", "hardware=a100_40gb", "batch_size=2", "max_seq_len=16", "precision=fp32"]
    names = older.adjustments({"common": {"software": "torch 2.0.0"}})
    cache = {}
    now, then = (ve.estimate(job + ["optim=adamw_torch"], cache, tuple(n)) for n in ([], names))
    # the installed step's one list is the peak's temporaries (the parameters' size); the older step's two
    assert now["breakdown"]["temp"] >= 0.99 * now["breakdown"]["params"]
    assert then["breakdown"]["temp"] == 2 * now["breakdown"]["temp"]
    assert then["peak_bytes"] - now["peak_bytes"] == now["breakdown"]["temp"]
    sgd_now, sgd_then = (ve.estimate(job + ["optim=sgd"], cache, tuple(n)) for n in ([], names))
    assert sgd_now["peak_bytes"] == sgd_then["peak_bytes"]


def test_a_published_time_is_read_as_seconds_per_optimizer_step_however_the_source_prints_it():
    import published_time as pt

    est = {"micro_batch_size": 4, "accumulation_steps": 4, "seq_len": 197, "predicted_step_s": 0.25}
    assert pt.published_step_s({"time_elapsed": "12.91 min", "optimizer_steps": 2812}, est) == pytest.approx(
        12.91 * 60 / 2812)
    assert pt.published_step_s({"time_per_step": "1.27s/it"}, est) == 1.27
    assert pt.published_step_s({"imgs_per_sec": 32.0}, est) == 0.5  # 16 images a step
    assert pt.published_step_s({"tokens_per_sec": 16 * 197}, est) == 1.0
    assert pt.published_step_s({"tps_per_gpu": "1,576"}, est) == 2.0  # as printed, per GPU
    assert pt.published_step_s({"time_per_step": "OOM"}, est) is None and pt.published_step_s({}, est) is None
    row = pt.columns({"time_per_step": "0.2s/it"}, est)
    assert row["time error %"] == pytest.approx(25.0)
    # estimated on another card's profile (the table's time_on_profile: false): its time is not compared
    assert pt.columns({"time_per_step": "0.2s/it"}, est, timed_card=False)["time error %"] is None
    assert pt.columns({"time_per_step": "0.2s/it"}, {**est, "predicted_step_s": None})["time error %"] is None


def test_a_timed_loops_stated_validation_passes_are_predicted_beside_its_steps():
    import published_time as pt

    est = {"micro_batch_size": 12, "accumulation_steps": 1, "seq_len": 512, "predicted_step_s": 0.1,
           "step_time": {"forward_only_s": 0.03}}
    common = {"epochs": 3, "timed_evaluation_examples": 5000, "num_gpus": 1}
    row = {"time_elapsed": "15 min", "optimizer_steps": 9000}
    # 3 epochs x 417 batches of 12 (the last one short) x 30 ms, over 9,000 steps
    assert pt.evaluation_s_per_step(row, common, est) == pytest.approx(3 * 417 * 0.03 / 9000)
    assert pt.columns(row, est, common=common)["predicted s/step"] == pytest.approx(0.1 + 3 * 417 * 0.03 / 9000)
    # split among the ranks as a distributed sampler splits it
    assert pt.evaluation_s_per_step({**row, "num_gpus": 4}, common, est) == pytest.approx(3 * 105 * 0.03 / 9000)
    # a table that states none, or a rate the source prints per step, adds nothing
    assert pt.columns(row, est)["predicted s/step"] == 0.1
    assert pt.evaluation_s_per_step({"time_per_step": "0.2s/it"}, common, est) == 0.0


def test_a_forward_alone_is_the_steps_forward_ops_as_the_queue_runs_them():
    from conftest import job_of
    from memsweep.estimate.core import estimate_job

    for hardware in ("a100_40gb", "cpu"):
        st = estimate_job(*job_of(["model=tiny", "batch_size=4", "max_seq_len=64", f"hardware={hardware}"])).step_time
        # no backward, no optimizer: a fraction of the step, at least its forward kernels' time
        assert st.forward_s <= st.forward_only_s < st.step_s


def test_a_ladders_predicted_order_by_time_is_its_rank_correlation_with_the_published_order():
    import pandas as pd

    import published_time as pt

    frame = pd.DataFrame({"table": ["a"] * 4 + ["b"] * 2, "published s/step": [1.0, 2.0, 3.0, 4.0, 1.0, 2.0],
                          "predicted s/step": [0.5, 0.7, 0.6, 2.0, 1.0, 2.0], "time error %": [1.0] * 6})
    order = pt.ladder_order(frame)
    assert list(order) == ["a"]  # b has two timed rows: no order to judge
    assert order["a"] == pytest.approx(0.8)  # ranks 1,3,2,4 against 1,2,3,4
    assert any("Spearman +0.80" in line for line in pt.summary(frame))


def test_a_table_sharded_with_lightnings_fsdp1_gives_each_unit_with_a_trainable_weight_a_whole_gradient():
    import older_libraries as older

    assert older.FSDP1_FLAT in older.adjustments(yaml.safe_load((PUBLISHED / "litgpt_lora_alpaca_multi_a100_fsdp.yaml")
                                                                .read_text()))
    assert older.FSDP1_FLAT not in older.adjustments(yaml.safe_load((PUBLISHED / "litgpt_lora_alpaca_1xa100_40gb.yaml")
                                                                    .read_text()))
    rows, common = published_rows("litgpt_lora_alpaca_multi_a100_fsdp")
    job, _ = ve.job_for("litgpt_lora_alpaca_multi_a100_fsdp",
                        rows["13 B Llama 2 13B / None / micro-batch 1 / 4 x A100"], common)
    assert {"distributed.nproc=4", "batch_size=512", "accumulation.steps=128", "fsdp=full_shard",
            "checkpointing=full", "lora=r8"} <= set(job)
    # tiny-llama, LoRA r8 on q/k/v, two blocks as two FSDP units over two ranks, two accumulated micro-batches
    job = ["task=causal_lm", "model=tiny-llama", "hardware=a100_40gb", "batch_size=8", "accumulation.steps=2",
           "max_seq_len=16", "precision=bf16_true", "optim=adamw_torch", "lora=r8", "distributed.nproc=2",
           "fsdp=full_shard", "checkpointing=full"]
    cache = {}
    now, then = (ve.estimate(job, cache, names) for names in ((), (older.FSDP1_FLAT,)))
    lora = (8 * 64 + 64 * 8) + 2 * (8 * 64 + 32 * 8)  # a block's A and B on q (64 -> 64), k and v (64 -> 32)
    block = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64 + lora
    assert now["breakdown"]["grads"] == 2 * lora * 4  # FSDP2: the adapters' fp32 gradients only
    assert then["breakdown"]["grads"] == 2 * block * 2  # FSDP1: every block's whole bf16 gradient, unsharded
    # still the adapters' state only (in bf16 now): not the blocks'
    assert then["optimizer_bytes"] == pytest.approx(now["optimizer_bytes"] / 2, rel=0.01)


def test_lit_gpts_tables_are_estimated_with_its_loss_and_its_bitsandbytes_4_bit_layers():
    import torch
    from transformers.loss.loss_utils import LOSS_MAPPING

    import litgpt
    import older_libraries as older

    table, rows = table_and_rows("litgpt_lora_alpaca_1xa100_40gb")
    # bitsandbytes 0.41.1, torch 2.1.0, lit-gpt 8641822b's code under Fabric's bf16-true; its RMSNorm for the Llamas
    assert older.adjustments(table) == [older.BNB_KEEPS_INPUT, litgpt.LOSS, litgpt.FABRIC_OUTPUTS, litgpt.ATTENTION]
    assert older.adjustments(table, rows["7 B Llama 2 7B / None / micro-batch 1"])[-1] == litgpt.RMSNORM
    assert older.adjustments({"common": {"software": "bitsandbytes 0.43.2"}}) == []
    # the chunked loss is the same mean cross-entropy over the shifted tokens (lit-gpt's mean also counts an
    # ignored label's zero, as its code does; the tables' batches are right-padded with ignored labels)
    logits, labels = torch.randn(2, 11, 7), torch.randint(0, 7, (2, 11))
    with litgpt.loss(chunk=4):
        chunked = LOSS_MAPPING["ForCausalLM"](logits, labels, 7)
    assert LOSS_MAPPING["ForCausalLM"].__name__ == "ForCausalLMLoss"
    assert torch.allclose(chunked, LOSS_MAPPING["ForCausalLM"](logits, labels, 7))
    # tiny-llama in bf16 with every linear in 4 bits (the head too), on a GPU profile
    job = ["task=causal_lm", "model=tiny-llama", "hardware=a100_40gb", "batch_size=2", "max_seq_len=16",
           "precision=bf16_true", "lora=qlora", "model.quantize_skip_modules=[]", "optim=paged_adamw_32bit"]
    cache = {}
    now, keeps = (ve.estimate(job, cache, names) for names in ((), (older.BNB_KEEPS_INPUT,)))
    # kept at most: each block's attention input (its first block's needs no gradient), attention output, MLP input
    # and MLP product, and the head's input, in bf16 over 2 x 16 tokens
    kept = (2 * (64 + 64 + 64 + 128) - 64 + 64) * 32 * 2
    assert 0 < keeps["peak_allocated_bytes"] - now["peak_allocated_bytes"] <= kept
    # at 2 x 128 tokens the peak is at the loss: no fp32 copy of the logits, nor an fp32 log-softmax and its gradient
    long = [o for o in job if not o.startswith("max_seq_len")] + ["max_seq_len=128"]
    now, loss = (ve.estimate(long, cache, names) for names in ((), (litgpt.LOSS,)))
    logits = 2 * 128 * 30522
    assert now["peak_allocated_bytes"] - loss["peak_allocated_bytes"] >= 4 * logits
    # Fabric's float32 logits, held by lit-gpt's loop, and the float32 log-softmax read from them
    fabric = ve.estimate(long, cache, (litgpt.LOSS, litgpt.FABRIC_OUTPUTS))
    assert fabric["peak_allocated_bytes"] - loss["peak_allocated_bytes"] >= 4 * logits


def table_and_rows(stem):
    table = yaml.safe_load((PUBLISHED / f"{stem}.yaml").read_text())
    return table, {row["label"]: row for row in table["rows"]}


def test_lit_gpts_attention_keeps_its_fused_qkv_output_and_its_padded_lora_update():
    import litgpt

    # GPT-NeoX, whose fused query_key_value is lit-gpt's `attn`: two blocks of 4,096 wide, 16 tokens, LoRA in bf16
    job = ["task=causal_lm", "model=stablelm-base-alpha-3b", "+model.overrides.num_hidden_layers=2",
           "hardware=a100_40gb", "batch_size=1", "max_seq_len=16", "precision=bf16_true", "optim=adamw_torch",
           "lora=r8", "lora.autocast_adapter_dtype=false", "lora.target_modules=[query_key_value]"]
    now, lit = (ve.estimate(job, {}, names) for names in ((), (litgpt.ATTENTION,)))
    n, tokens = 4096, 16
    # a block keeps the whole fused output (3n) where transformers kept its cache's copy of v (n), and the padded
    # q and v update (2n) with its int64 column index
    block = (3 * n - n + 2 * n) * tokens * 2 + 2 * n * 8
    assert lit["breakdown"]["activations"] - now["breakdown"]["activations"] == 2 * block


def test_lit_gpts_rmsnorm_keeps_its_input_in_bf16():
    import litgpt

    job = ["task=causal_lm", "model=tiny-llama", "hardware=a100_40gb", "batch_size=2", "max_seq_len=64",
           "precision=bf16_true", "optim=adamw_torch", "lora=r8", "lora.autocast_adapter_dtype=false"]
    now, lit = (ve.estimate(job, {}, names) for names in ((), (litgpt.RMSNORM,)))
    # each of the two blocks' two norms keeps its 2 x 64 x 64 input and its rsqrt per token in bf16, not fp32
    assert now["breakdown"]["activations"] - lit["breakdown"]["activations"] == 4 * (128 * 64 + 128) * 2


def test_a_script_zeroing_gradients_after_the_forward_holds_the_last_steps_through_it():
    import older_libraries as older

    distilbert, rows = table_and_rows("rasbt_distilbert_imdb_precision")
    assert all(older.ZERO_GRAD_AFTER_FORWARD in older.adjustments(distilbert, row) for row in rows.values())
    vit, rows = table_and_rows("rasbt_vit_l16_cifar10_memory_ladder")
    named = {label: older.ZERO_GRAD_AFTER_FORWARD in older.adjustments(vit, row) for label, row in rows.items()}
    # 05 and 06 accumulate: their scripts zero after the optimizer step, as Trainer does
    assert [label[:2] for label, on in named.items() if not on] == ["05", "06"]
    job = ["model=tiny", "hardware=a100_40gb", "batch_size=8", "max_seq_len=128", "precision=fp32", "optim=adamw_torch"]
    cache = {}
    now, then = (ve.estimate(job, cache, names) for names in ((), (older.ZERO_GRAD_AFTER_FORWARD,)))
    # Trainer's order: no gradient during the forward. The script's: every gradient of the step before, beside
    # all the forward holds for backward, until backward begins
    assert then["breakdown"]["grads"] == now["breakdown"]["params"]
    assert then["breakdown"]["activations"] >= now["activations_bytes"] > 0
    assert then["peak_bytes"] > now["breakdown"]["params"] * 2 + now["optimizer_bytes"] + now["activations_bytes"]


def test_fsdp1_before_its_rate_limiter_gives_back_unsharded_buffers_only_after_the_micro_batch():
    import older_libraries as older
    from memsweep.app.estimate import compose
    from memsweep.config import hardware
    from memsweep.estimate.core import build_setup, traced_step
    from memsweep.estimate.events import Event

    vit, rows = table_and_rows("rasbt_vit_l16_cifar10_memory_ladder")
    assert [label[:2] for label, row in rows.items() if older.FSDP1_UNLIMITED in older.adjustments(vit, row)] == [
        "08", "09", "10"]  # torch 2.1.0.dev20230623, Lightning's FSDPStrategy
    lit, rows = table_and_rows("litgpt_lora_alpaca_multi_a100_fsdp")  # torch 2.1.0: the limiter on by default
    assert not any(older.FSDP1_UNLIMITED in older.adjustments(lit, row) for row in rows.values())
    job = compose(["model=tiny", "hardware=a100_40gb", "batch_size=8", "max_seq_len=128", "precision=fp32",
                   "optim=adamw_torch", "distributed.nproc=2", "fsdp=full_shard", "checkpointing=full"])
    profile = hardware.detect(job.hardware)
    now = traced_step(job, profile, build_setup(job, profile))
    with older.stepping_as([older.FSDP1_UNLIMITED]):
        then = traced_step(job, profile, build_setup(job, profile))
    requested = [e.key for e in then.events if e.kind == "free_requested"]
    end, step = then.events.index(Event.mark("end")), then.events.index(Event.mark("step"))
    completed = [e.key for e in then.events[step:end] if e.kind == "free_completed"]
    assert requested and sorted(requested) == sorted(completed)  # each given back once, after the optimizer step
    assert not any(e.kind == "free_requested" for e in now.events)
    # what the tensors hold is the same; what the allocator keeps grows by at least the backward's unsharded
    # parameters and gradients (the model's two fp32 copies), which no later request may reuse within the step
    assert then.peak_bytes == now.peak_bytes
    assert then.allocator.peak_allocated_bytes == now.allocator.peak_allocated_bytes
    grown = then.allocator.peak_reserved_bytes - now.allocator.peak_reserved_bytes
    assert grown >= 2 * 4 * then.total_params


def test_fsdp1s_cpu_offload_copies_each_shard_to_the_device_and_keeps_backwards_gradients_there():
    import fsdp1
    import older_libraries as older
    from memsweep.estimate.events import Event

    micro_batch = [Event.mark("forward"), fsdp1.gather_event(4), Event.alloc("act", 16), Event.mark("backward"),
                   fsdp1.gather_event(4), Event.alloc("grad", 8), Event.free("act")]
    events = [Event.alloc("old grad", 8)] + micro_batch + micro_batch[:-2] + [Event.mark("step"), Event.mark("end")]
    categories = {"old grad": "grads", "act": "activations", "grad": "grads"}
    out, cats = fsdp1.offloaded(events, categories)
    copies = [e.key for e in out if e.kind == "alloc" and e.key not in categories]
    assert [e for e in out if e.kind == "alloc" and e.key in copies] == [Event.alloc(c, 4) for c in copies]
    assert len(copies) == 4
    # each copy is requested free at once (NCCL's stream still reads it) and given back at its micro-batch's end
    second, end = [i for i, e in enumerate(out) if e.is_mark("forward")][1], out.index(Event.mark("end"))
    assert out[second - 2:second] == [Event.free_completed(c) for c in copies[:2]]
    assert out[end - 2:end] == [Event.free_completed(c) for c in copies[2:]]
    assert cats["old grad"] == "host" and cats["grad"] == "grads"  # the step before's on the host, backward's not
    job = ["model=tiny", "hardware=a100_40gb", "batch_size=8", "max_seq_len=128", "precision=fp32", "optim=adamw_torch",
           "distributed.nproc=2", "fsdp=full_shard_offload", "checkpointing=full"]
    cache = {}
    now, then = (ve.estimate(job, cache, names) for names in ((), (older.FSDP1_UNLIMITED,)))
    assert now["grads_bytes"] == 0 < then["grads_bytes"]
    assert then["peak_reserved_bytes"] > now["peak_reserved_bytes"]


def test_torchtitans_tables_reduce_gradients_in_fp32_as_its_mixed_precision_policy_does():
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin

    import older_libraries as older

    titan, rows = table_and_rows("torchtitan_llama31_8b_fsdp_8xh100")
    assert all(older.FP32_REDUCE in older.adjustments(titan, row) for row in rows.values())
    with older.fp32_reduce():
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
        plugin.set_mixed_precision("bf16")
    policy = plugin.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    job = ["task=causal_lm", "model=tiny-llama", "hardware=a100_40gb", "batch_size=2", "max_seq_len=16",
           "precision=bf16", "optim=adamw_torch", "distributed.nproc=2", "fsdp=full_shard"]
    cache = {}
    now, then = (ve.estimate(job, cache, names) for names in ((), (older.FP32_REDUCE,)))
    # the weights, gradients and state are the same; what the reduction holds is in fp32, twice bf16's bytes
    assert {k: then["breakdown"][k] for k in ("params", "grads")} == \
        {k: now["breakdown"][k] for k in ("params", "grads")}
    assert then["peak_bytes"] > now["peak_bytes"]


def test_torchtunes_april_2024_recipe_holds_its_fp32_logits_through_the_backward():
    import older_libraries as older

    for stem in ("torchtune_llama2_7b_lora_rank_targets", "torchtune_llama2_7b_qlora_vs_lora_reserved"):
        assert older.TORCHTUNE_LOGITS in older.adjustments(table_and_rows(stem)[0])  # commits of 2024-04-15
    later, _ = table_and_rows("torchtune_llama32_3b_optimization_ladder")  # its commit's recipe deletes them
    assert older.TORCHTUNE_LOGITS not in older.adjustments(later)
    assert not older.holds_logits("torchtune at commit 8a98fbaa34d2 (2024-07-28)")  # PR #1235 deletes them
    job = ["task=causal_lm", "model=tiny-llama", "hardware=a100_80gb", "batch_size=4", "accumulation.steps=2",
           "max_seq_len=64", "precision=bf16_true", "optim=adamw_torch", "checkpointing=full", "lora=r8"]
    cache = {}
    now, held = (ve.estimate(job, cache, names) for names in ((), (older.TORCHTUNE_LOGITS,)))
    # checkpointed blocks keep little, so the peak is the loss's: it rises by about the held fp32 shifted logits
    # of 2 x 63 tokens over tiny-llama's 30,522 words (less what transformers' own loss had there instead)
    shifted = 2 * 63 * 30522 * 4
    assert 0.9 * shifted <= held["peak_allocated_bytes"] - now["peak_allocated_bytes"] <= shifted


def test_distilbert_on_transformers_4_masks_its_scores_in_their_own_dtype():
    import older_libraries as older

    distilbert, rows = table_and_rows("rasbt_distilbert_imdb_precision")  # states transformers 4.28.1
    assert all(older.DISTILBERT_MASKED_FILL in older.adjustments(distilbert, row) for row in rows.values())
    bigbird, rows = table_and_rows("rasbt_distilbert_bigbird_imdb_4gpu")  # states no transformers
    assert not any(older.DISTILBERT_MASKED_FILL in older.adjustments(bigbird, row) for row in rows.values())
    job = ["model=distilbert", "hardware=a100_40gb", "batch_size=4", "max_seq_len=256", "optim=adamw_torch",
           "attention=eager", "model.num_layers=2"]
    cache = {}
    now, then = ({p: ve.estimate(job + [f"precision={p}"], cache, names)["predicted_step_s"] for p in ("fp16", "bf16")}
                 for names in ((), (older.DISTILBERT_MASKED_FILL,)))
    # The installed attention adds an fp32 mask to the scores: fp16 and bf16 step alike but for fp16's loss scaling.
    # 4.x's keeps them 16-bit up to the softmax, which CUDA's autocast runs from fp16 directly and from bf16
    # through an fp32 copy: a pass over every score more, so bf16 is the slower
    assert now["bf16"] <= now["fp16"]
    assert then["bf16"] > then["fp16"]


def test_the_report_counts_the_rows_predicted_under_in_total_and_per_table():
    import pandas as pd

    frame = pd.DataFrame({"table": ["a", "a", "b", "b", "c"], "row": list("vwxyz"), "counter": ["m"] * 5,
                          "published GiB": [1.0] * 5, "predicted GiB": [0.9, 1.1, 0.97, 0.8, None],
                          "error %": [-10.0, 10.0, -3.0, -20.0, None], "published s/step": [None] * 5,
                          "predicted s/step": [None] * 5, "time error %": [None] * 5, "note": [""] * 5})
    text = ve.report(frame)
    assert "all modelled rows: 3 of 4 (75 %) predicted under the published figure (largest under -20.0 %)" in text
    assert "  a: 1 of 2 (50 %) predicted under the published figure (largest under -10.0 %)" in text
    assert "  b: 2 of 2 (100 %) predicted under the published figure (largest under -20.0 %)" in text
    assert "  c:" not in text  # a table of no modelled row
    over = frame.assign(**{"error %": [1.0, 2.0, 3.0, 4.0, None]})
    assert "all modelled rows: 0 of 4 (0 %) predicted under the published figure (none under)" in ve.report(over)
