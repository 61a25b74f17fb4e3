"""Decoder LLMs: every technique group on tiny random decoders (task=causal_lm), each job's effect asserted
on its `effective` audit and memory ledger against one shared plain job; a classifier on a decoder; the
hub loading code on a decoder saved to a folder; and the combination that cannot run, refused by a rule.

Sizes are computed from tiny-llama's config (conf/model/tiny-llama.yaml), so a count that comes out
different says the technique acted on other parameters than it should."""
import math
import re

import pytest
import torch

from conftest import THREADS, build_job, run_job

# One worker runs the whole module (`make test`: --dist loadgroup), so its module fixture's jobs run once.
pytestmark = pytest.mark.xdist_group("decoders")

V, H, FF, LAYERS = 30522, 64, 128, 2  # tiny-llama: vocabulary, hidden, MLP width, blocks
KV = 2 * (H // 4)  # key/value width: 2 KV heads of head dim 16 (grouped-query attention)
TABLE = V * H  # the token embedding, and as many in tiny-llama's own (untied) lm_head
ATTENTION = H * H + 2 * H * KV + H * H  # q, k, v, o (no biases)
MLP = 3 * H * FF  # gate, up, down
BLOCK = ATTENTION + MLP + 2 * H  # and its two RMSNorms
PARAMS = 2 * TABLE + LAYERS * BLOCK + H  # embedding, blocks, final norm, lm_head
R = 8  # lora=r8
B, T = 8, 32

DEC = ["task=causal_lm", "logger=none", "progress=none", f"threads={THREADS}", "data.train_size=64",
       "data.eval_size=32", f"batch_size={B}", f"max_seq_len={T}", "max_steps=2", "measure.estimate=false"]
LLAMA = DEC + ["model=tiny-llama"]


def job(tmp_path, *overrides, base=LLAMA) -> dict:
    res = run_job(base + list(overrides), tmp_path / re.sub(r"[^\w.=-]+", "_", "_".join(overrides) or "plain"))
    assert res["status"] == "ok", res["reason"]
    return res


def lora_params(*shapes) -> int:
    """Adapter parameters of r8 on linear layers (in, out): A is r x in, B is out x r."""
    return R * sum(i + o for i, o in shapes)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return job(tmp_path_factory.mktemp("decoders"))


def test_a_decoder_trains_on_next_tokens_and_reports_perplexity(plain):
    eff, mem, metrics = plain["effective"], plain["memory"], plain["metrics"]
    assert eff["total_params"] == eff["trainable_params"] == PARAMS and eff["param_dtype"] == "float32"
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["eval_loss"])) and metrics["f1"] is None
    # the same eval split before training: random weights give near-uniform logits, a loss near ln(vocabulary)
    assert metrics["perplexity_before"] == pytest.approx(math.exp(metrics["eval_loss_before"]))
    assert abs(metrics["eval_loss_before"] - math.log(V)) < 0.1 and metrics["eval_loss_before"] != metrics["eval_loss"]
    assert plain["time"]["eval_before_s"] > 0
    assert plain["time"]["optimizer_steps"] == 2
    assert mem["params_bytes"] == mem["grads_bytes"] == 4 * PARAMS
    assert mem["optimizer_bytes"] == pytest.approx(8 * PARAMS, abs=1024)  # AdamW's two fp32 moments
    # held for backward: at least the logits over the vocabulary at every position
    assert mem["activations_bytes"] >= B * T * V * 4


def test_lora_adapts_q_k_v_of_every_block_and_drops_the_optimizer_state(tmp_path, plain):
    res = job(tmp_path, "lora=r8")
    eff, mem = res["effective"], res["memory"]
    trainable = LAYERS * lora_params((H, H), (H, KV), (H, KV))
    assert eff["lora_modules"] == 3 * LAYERS and eff["trainable_params"] == trainable
    assert eff["frozen_params"] == PARAMS  # the whole base, lm_head included (peft's CAUSAL_LM)
    assert mem["grads_bytes"] == 4 * trainable and mem["optimizer_bytes"] == pytest.approx(8 * trainable, abs=128)
    assert mem["peak_bytes"] <= plain["memory"]["peak_bytes"] - 0.9 * plain["memory"]["optimizer_bytes"]


def test_all_linear_adapts_every_linear_layer_of_the_blocks_not_the_head(tmp_path):
    res = job(tmp_path, "lora=r8", "lora.target_modules=all-linear")
    eff = res["effective"]
    per_block = lora_params((H, H), (H, KV), (H, KV), (H, H), (H, FF), (H, FF), (FF, H))
    assert eff["lora_modules"] == 7 * LAYERS  # q, k, v, o, gate, up, down: against 3 (q, k, v) by default
    assert eff["trainable_params"] == LAYERS * per_block and eff["frozen_params"] == PARAMS


@pytest.mark.parametrize("option, dtype, stored_bytes", [("qlora", "uint8", 0.5), ("int8", "int8", 1)])
def test_quantized_bases_store_the_block_linears_and_keep_the_rest(tmp_path, plain, option, dtype, stored_bytes):
    res = job(tmp_path, f"lora={option}")
    eff, quantized = res["effective"], LAYERS * (ATTENTION + MLP)
    adapters = LAYERS * lora_params((H, H), (H, KV), (H, KV))
    assert eff["lora_modules"] == 3 * LAYERS and eff["trainable_params"] == adapters
    # 4-bit packs two values a byte; embedding, lm_head and norms stay fp32 (structure.quantize_skip)
    assert eff["param_dtypes"] == {dtype: int(quantized * stored_bytes), "float32": 2 * TABLE + (2 * LAYERS + 1) * H
                                   + adapters}
    assert res["memory"]["params_bytes"] == (plain["memory"]["params_bytes"] - 4 * quantized
                                             + int(quantized * stored_bytes) + 4 * adapters)


def test_bf16_true_loads_a_quantized_base_in_bf16(tmp_path):
    # `.to(bf16)` is refused by a bitsandbytes model: from_pretrained's dtype stores it instead.
    res = job(tmp_path, "lora=qlora", "precision=bf16_true")
    dtypes = res["effective"]["param_dtypes"]
    assert dtypes["uint8"] == LAYERS * (ATTENTION + MLP) // 2 and dtypes["bfloat16"] == 2 * TABLE + 5 * H
    assert dtypes["float32"] == LAYERS * lora_params((H, H), (H, KV), (H, KV))  # peft keeps adapters fp32
    assert res["effective"]["compute_dtype"] == "bfloat16"


def test_checkpointing_recomputes_every_block_and_keeps_the_loss(tmp_path, plain):
    res = job(tmp_path, "checkpointing=full")
    assert res["effective"]["checkpointed_layers"] == LAYERS and plain["effective"]["checkpointed_layers"] == 0
    assert res["metrics"]["train_loss"] == pytest.approx(plain["metrics"]["train_loss"], abs=1e-6)
    # A block then holds only its input; unchecked it holds well over 8 hidden-sized tensors (norms, q/k/v,
    # attention, MLP). The vocabulary logits dominate a model this small and are not checkpointed.
    saved = plain["memory"]["activations_bytes"] - res["memory"]["activations_bytes"]
    assert saved >= LAYERS * 8 * B * T * H * 4
    assert res["memory"]["peak_bytes"] < plain["memory"]["peak_bytes"]


def test_8bit_optimizers_quantize_all_state_but_the_embeddings(tmp_path, plain):
    for name in ("adamw_8bit", "paged_adamw_8bit"):
        res = job(tmp_path, f"optim={name}")
        state, rest = res["memory"]["optimizer_bytes"], PARAMS - TABLE
        assert res["effective"]["optimizer_kernel"] is None  # bitsandbytes', not torch's
        # transformers keeps nn.Embedding at 32-bit state; the untied lm_head is a Linear: 8-bit (+ block scales)
        assert 8 * TABLE + 2 * rest <= state <= 8 * TABLE + 2.2 * rest, (name, state)
        assert res["memory"]["peak_bytes"] < plain["memory"]["peak_bytes"] - 0.9 * (plain["memory"]["optimizer_bytes"]
                                                                                  - state)
        assert res["metrics"]["train_loss"] == pytest.approx(plain["metrics"]["train_loss"], rel=1e-4)


def test_zero2_trains_as_plain_pytorch(tmp_path, plain):
    res = job(tmp_path, "deepspeed=zero2")
    assert res["effective"]["deepspeed_stage"] == 2
    for key in ("train_loss", "eval_loss"):
        assert res["metrics"][key] == pytest.approx(plain["metrics"][key], abs=1e-4)
    assert res["memory"]["optimizer_bytes"] == pytest.approx(plain["memory"]["optimizer_bytes"], rel=1e-4)


def test_fsdp_wraps_each_block_shards_every_parameter_once_and_trains_as_plain(tmp_path, plain):
    import torch.distributed as dist

    res = job(tmp_path, "fsdp=full_shard")
    audit = res["effective"]["fsdp"]
    # Accelerate's FSDP2 units for a decoder: each block, the embedding, the tail (final norm + lm_head,
    # one unit of two modules) and the root
    assert audit["unit_classes"] == ["Embedding", "Linear", "LlamaDecoderLayer", "LlamaForCausalLM", "LlamaRMSNorm"]
    assert audit["sharded_params"] == audit["params"] == 3 + LAYERS * 9
    assert audit["local_numel"] == audit["global_numel"] == PARAMS and audit["world_size"] == 1
    assert audit["resharded_after_forward"] == LAYERS + 1  # blocks and embedding; the tail stays gathered
    for key in ("train_loss", "eval_loss"):
        assert res["metrics"][key] == pytest.approx(plain["metrics"][key], abs=1e-5)
    # In one process the gathered tail is a second copy of lm_head from forward to backward.
    assert res["memory"]["params_bytes"] == pytest.approx(plain["memory"]["params_bytes"] + 4 * TABLE, abs=1024)
    assert not dist.is_initialized()


def test_x4_accumulation_quarters_the_micro_batch_and_the_activations(tmp_path, plain):
    res = job(tmp_path, "accumulation=x4")
    eff = res["effective"]
    assert (eff["accumulation_steps"], eff["micro_batch_size"]) == (4, B // 4)
    assert res["time"]["optimizer_steps"] == plain["time"]["optimizer_steps"]
    assert 0.2 < res["memory"]["activations_bytes"] / plain["memory"]["activations_bytes"] < 0.3
    assert res["metrics"]["train_loss"] == pytest.approx(plain["metrics"]["train_loss"], rel=1e-3)


def test_bf16_computes_in_bf16_over_fp32_master_weights(tmp_path, plain):
    res = job(tmp_path, "precision=bf16")
    eff, mem = res["effective"], res["memory"]
    assert (eff["compute_dtype"], eff["param_dtype"]) == ("bfloat16", "float32")
    assert eff["emulated_precision"] == (None if res["hardware"]["bf16_native"] else "bf16")
    for key in ("params_bytes", "grads_bytes"):
        assert mem[key] == plain["memory"][key]
    assert mem["optimizer_bytes"] == pytest.approx(plain["memory"]["optimizer_bytes"], abs=1024)
    # The loss upcasts the logits to fp32, and they dominate this model's activations: mixed bf16 saves
    # none here (autocast's bf16 copies of block inputs even add a little).
    assert mem["activations_bytes"] == pytest.approx(plain["memory"]["activations_bytes"], rel=0.1)
    assert res["metrics"]["train_loss"] == pytest.approx(plain["metrics"]["train_loss"], rel=1e-3)


def test_freezing_embeddings_drops_their_gradient_and_state(tmp_path, plain):
    res = job(tmp_path, "freezing=embeddings")
    eff, mem = res["effective"], res["memory"]
    assert eff["frozen_params"] == TABLE and eff["trainable_params"] == PARAMS - TABLE
    assert mem["grads_bytes"] == 4 * eff["trainable_params"]
    assert mem["optimizer_bytes"] == pytest.approx(8 * eff["trainable_params"], abs=1024)
    assert mem["peak_bytes"] <= plain["memory"]["peak_bytes"] - 0.9 * 8 * TABLE


def _trainable(overrides, job_dir):
    model = build_job(DEC + overrides, job_dir).trainer.model
    return model, {n for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("option, trainable", [
    ("embeddings", lambda n: n != "model.embed_tokens.weight"),
    ("bottom_half", lambda n: n != "model.embed_tokens.weight" and not n.startswith("model.layers.0.")),
    ("encoder", lambda n: n == "lm_head.weight"),  # all but the head
])
def test_freezing_on_an_untied_decoder(tmp_path, option, trainable):
    model, got = _trainable(["model=tiny-llama", f"freezing={option}"], tmp_path)
    assert got == {n for n, _ in model.named_parameters() if trainable(n)}


@pytest.mark.parametrize("option, head_trains", [("embeddings", False), ("bottom_half", False), ("encoder", True)])
def test_freezing_on_a_tied_decoder_follows_the_part_it_names(tmp_path, option, head_trains):
    # One matrix is Qwen2's token embedding and its lm_head (techniques/freezing.py says why each option
    # treats it as it does); named_parameters lists it once, as the embedding.
    model, got = _trainable(["model=tiny-qwen2", f"freezing={option}"], tmp_path)
    shared = model.model.embed_tokens.weight
    assert model.lm_head.weight is shared and shared.requires_grad is head_trains
    blocks = {n for n, _ in model.named_parameters() if n.startswith("model.layers.") or n == "model.norm.weight"}
    expected = {"embeddings": blocks, "bottom_half": {n for n in blocks if not n.startswith("model.layers.0.")},
                "encoder": {"model.embed_tokens.weight"}}[option]
    assert got == expected


def test_gpt2_freezing_embeddings_freezes_token_and_position_tables(tmp_path):
    model, got = _trainable(["model=tiny-gpt2", "freezing=embeddings"], tmp_path)
    assert {"transformer.wte.weight", "transformer.wpe.weight"}.isdisjoint(got)
    assert model.lm_head.weight is model.transformer.wte.weight  # the tied head with them
    assert got == {n for n, _ in model.named_parameters() if n.startswith(("transformer.h.", "transformer.ln_f."))}


@pytest.fixture(scope="module", params=["tiny-gpt2", "tiny-qwen2"])
def other(request, tmp_path_factory):
    return request.param, job(tmp_path_factory.mktemp(request.param), base=DEC + [f"model={request.param}"])


def test_gpt2_and_qwen2_take_lora_and_checkpointing(tmp_path, other):
    name, base = other
    lora = job(tmp_path, "lora=r8", base=DEC + [f"model={name}"])
    # GPT-2 makes q, k and v in one Conv1D (c_attn, 64 -> 192); Qwen2 has three projections, as Llama
    modules, trainable = {"tiny-gpt2": (LAYERS, LAYERS * lora_params((H, 3 * H))),
                          "tiny-qwen2": (3 * LAYERS, LAYERS * lora_params((H, H), (H, KV), (H, KV)))}[name]
    assert (lora["effective"]["lora_modules"], lora["effective"]["trainable_params"]) == (modules, trainable)
    assert lora["effective"]["frozen_params"] == base["effective"]["total_params"]

    ckpt = job(tmp_path, "checkpointing=full", base=DEC + [f"model={name}"])
    assert ckpt["effective"]["checkpointed_layers"] == LAYERS
    assert ckpt["metrics"]["train_loss"] == pytest.approx(base["metrics"]["train_loss"], abs=1e-6)
    assert ckpt["memory"]["activations_bytes"] <= base["memory"]["activations_bytes"] - LAYERS * 8 * B * T * H * 4


def test_a_decoder_classifies_with_its_score_head(tmp_path):
    res = job(tmp_path, "task=classification")
    eff = res["effective"]
    assert eff["total_params"] == eff["trainable_params"] == TABLE + LAYERS * BLOCK + H + H * 2  # no lm_head
    assert res["metrics"]["f1"] is not None and res["metrics"]["perplexity"] is None


def test_a_decoder_classifier_reads_the_last_token_before_the_padding(tmp_path):
    built = build_job(LLAMA + ["task=classification"], tmp_path)
    model, tokenizer = built.trainer.model.eval(), built.trainer.processing_class
    assert built.trainer.setup.structure.head == ("score",)
    assert model.config.pad_token_id == tokenizer.pad_token_id is not None
    texts = ["a short tweet", "a longer tweet that needs no padding at all"]
    with torch.no_grad():
        alone = torch.cat([model(**tokenizer(t, return_tensors="pt")).logits for t in texts])
        batched = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits
    assert torch.allclose(alone, batched, atol=1e-5)  # right padding does not move the read position


def test_hub_code_loads_a_decoder_from_a_local_folder(tmp_path):
    from transformers import AutoModelForCausalLM

    from memsweep.config.schema import ModelConf, ModelSource
    from memsweep.run import model

    folder = tmp_path / "llama"
    tiny = ModelConf(source=ModelSource.tiny, architecture="llama", hidden_size=32, num_layers=2, num_heads=4,
                     num_kv_heads=2, intermediate_size=64, overrides={"bos_token_id": 101, "eos_token_id": 102})
    saved = model.load_model(tiny, 2, {}, AutoModelForCausalLM)
    saved.config.pad_token_id = None  # as a real decoder's config.json: no pad token
    saved.save_pretrained(folder)
    tokenizer = model.load_tokenizer(ModelConf())
    tokenizer.eos_token, tokenizer.pad_token = "[SEP]", None  # as a real decoder's tokenizer: no pad token
    tokenizer.save_pretrained(folder)
    assert saved.config.pad_token_id is None

    # The folder's own config.json wins over the architecture shipped for meta-llama/Llama-3.2-1B.
    source = ["model=llama-3.2-1b", f"model.path={folder}"]
    res = job(tmp_path, *source, base=DEC)
    assert res["effective"]["total_params"] == sum(p.numel() for p in saved.parameters())
    assert math.isfinite(res["metrics"]["perplexity"])

    built = build_job(DEC + source + ["task=classification"], tmp_path / "classifier")
    tok = built.trainer.processing_class
    assert (tok.pad_token, tok.pad_token_id) == ("[SEP]", 102)  # batches pad with EOS
    assert built.trainer.model.config.pad_token_id == 102  # and the classifier reads before it


def test_int8_lora_with_fsdp_is_refused_with_its_reason(tmp_path):
    from memsweep.techniques import rules

    res = run_job(LLAMA + ["lora=int8", "fsdp=full_shard"], tmp_path)
    reason = next(r.reason for r in rules.RULES if r.name == "int8-with-fsdp")
    assert (res["status"], res["reason"]) == ("unsupported", f"int8-with-fsdp: {reason}")


def test_4bit_weights_an_eval_forward_repacked_are_made_trainable_again():
    # On a CPU with AVX512-BF16 bitsandbytes repacks 4-bit weights for inference at an eval-mode forward (the
    # perplexity before training runs one); forced here on any CPU, as the layer decides it by this flag.
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf
    from bitsandbytes.nn import Linear4bit

    from memsweep.run.trainer import unpack_4bit_for_training

    torch.manual_seed(0)
    layer = Linear4bit(64, 32, bias=False, quant_type="nf4", compute_dtype=torch.float32)
    layer.weight = bnb.nn.Params4bit(torch.randn(32, 64), requires_grad=False, quant_type="nf4")
    layer = layer.to("cpu")  # quantizes
    weights = bnbf.dequantize_4bit(layer.weight.data, layer.weight.quant_state).clone()
    layer.support_avx512bf16_for_cpu = True
    layer.eval()
    with torch.no_grad():
        layer(torch.randn(4, 64))
    assert layer.weight.quant_state.packing_format_for_cpu  # the inference layout
    unpack_4bit_for_training(layer)
    assert not getattr(layer.weight.quant_state, "packing_format_for_cpu", False)
    # bitsandbytes' round trip is not bit-exact (its packed layout keeps the block scales in lower precision)
    restored = bnbf.dequantize_4bit(layer.weight.data, layer.weight.quant_state)
    assert torch.allclose(restored, weights, atol=0.02 * weights.abs().max().item())
    layer.train()
    x = torch.randn(4, 64, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
