"""The closed form on decoder LLMs (estimate/decoder.py, decoder_moments.py): against the trace on the
tiny Llama, Qwen2 (tied head, q/k/v bias) and GPT-2 (fused Conv1D q/k/v, dropout) decoders, against
real measured jobs, and at the scale of the shipped hub configs.

The trace is the reference where it runs (it reproduces the measured ledger, tests/test_estimate.py);
every comparison is with a figure computed here, never one written into the test.
"""
import pytest
from conftest import THREADS, job_of, run_job

from memsweep.estimate import core

MODELS = ["tiny-llama", "tiny-qwen2", "tiny-gpt2"]
GRID_SHAPE = ["task=causal_lm", "logger=none", "threads=1", "batch_size=4", "max_seq_len=32"]
# A shape where the layers weigh as much as the vocabulary's logits: the layer terms must be right too
LAYER_SHAPE = ["task=causal_lm", "logger=none", "threads=1", "batch_size=4", "max_seq_len=128", "model.vocab_size=1000",
               "model.hidden_size=256", "model.intermediate_size=704", "model.num_layers=4", "model.num_heads=8"]
# A fraction of precision x optim x checkpointing x lora in which every pair of values appears
SUBSET = [["precision=fp32", "optim=adamw", "checkpointing=none", "lora=none"],
          ["precision=fp32", "optim=sgd", "checkpointing=full", "lora=r8"],
          ["precision=fp32", "optim=adafactor", "checkpointing=full", "lora=none"],
          ["precision=bf16", "optim=adamw", "checkpointing=full", "lora=r8"],
          ["precision=bf16", "optim=sgd", "checkpointing=none", "lora=none"],
          ["precision=bf16", "optim=adafactor", "checkpointing=none", "lora=r8"]]


def estimate(overrides) -> dict:
    return core.estimate_job(*job_of(overrides))


def assert_closed_form_near_trace(est, overrides, rel=0.15):
    assert est["method"] == "trace" and est["closed_form"] is not None, (overrides, est["closed_form_reason"])
    assert est["closed_form"]["peak_bytes"] == pytest.approx(est["trace"]["peak_bytes"], rel=rel), \
        (overrides, est["closed_form_vs_trace_pct"], est["closed_form"]["phase"])


@pytest.mark.parametrize("model", MODELS)
def test_closed_form_follows_the_trace_on_the_grid_shape(model):
    for overrides in SUBSET:
        est = estimate(GRID_SHAPE + [f"model={model}"] + overrides)
        assert_closed_form_near_trace(est, overrides)
        # the matmul count (the head on every token) against FlopCounterMode on the traced step
        assert est["closed_form"]["flops_per_step"] == pytest.approx(est["flops_per_step"], rel=0.05), overrides


@pytest.mark.parametrize("model", MODELS)
def test_closed_form_follows_the_trace_where_the_layers_weigh(model):
    for overrides in SUBSET[:2] + SUBSET[3:5]:
        assert_closed_form_near_trace(estimate(LAYER_SHAPE + [f"model={model}"] + overrides), overrides)


def test_the_vocabulary_is_the_peak_on_the_grid_shape():
    # 30,522 tokens x 128 positions of logits: log_softmax's fp32 output and the two fp32 gradients of
    # the loss's backward are the largest tensors of the step, and the closed form says so
    est = estimate(GRID_SHAPE + ["model=tiny-llama", "optim=sgd"])
    assert est["closed_form"]["phase"] == "backward: loss"
    logits = 4 * 32 * 30522 * 4
    assert est["trace"]["breakdown"]["temp"] >= 2 * logits
    assert est["closed_form"]["breakdown"]["activations"] >= 3 * logits


def test_gpu_profile_kernels():
    # bool dropout masks and the memory-efficient kernel (k, v repeated to every head under padding)
    for model in ("tiny-llama", "tiny-gpt2"):
        for overrides in (["precision=bf16", "lora=r8"], ["precision=fp32", "attention=eager"]):
            est = estimate(LAYER_SHAPE + [f"model={model}", "hardware=a100_40gb", "optim=sgd"] + overrides)
            assert_closed_form_near_trace(est, overrides)


def test_classification_on_a_decoder():
    for model in ("tiny-llama", "tiny-gpt2"):
        for overrides in (["precision=fp32", "lora=none"], ["precision=bf16", "lora=r8", "checkpointing=full"]):
            shape = [o for o in LAYER_SHAPE if o != "task=causal_lm"] + ["task=classification"]
            assert_closed_form_near_trace(estimate(shape + [f"model={model}", "optim=sgd"] + overrides), overrides)


def test_bitsandbytes_jobs_are_traced_and_the_closed_form_agrees():
    # (not lora=int8: on the CPU bitsandbytes trains 8-bit layers through MatMul8bitFp, which the trace
    # runs; the closed form models the GPU's MatMul8bitLt)
    for overrides in (["optim=adamw_8bit"], ["optim=paged_adamw_8bit"], ["lora=qlora"],
                      ["lora=qlora", "checkpointing=full", "precision=bf16"]):
        est = estimate(LAYER_SHAPE + ["model=tiny-qwen2"] + overrides)
        assert_closed_form_near_trace(est, overrides)
        # the optimizer state (8-bit maps, block scales, 32-bit embeddings) the same in both
        assert est["closed_form"]["optimizer_bytes"] == est["optimizer_bytes"], overrides
    adamw, eight_bit = (estimate(GRID_SHAPE + ["model=tiny-qwen2", f"optim={o}"]) for o in ("adamw", "adamw_8bit"))
    # the tied embedding keeps 32-bit states (Trainer), the layers' matrices 8-bit ones
    assert eight_bit["optimizer_bytes"] < adamw["optimizer_bytes"]


def test_on_a_gpu_qlora_adds_the_block_scales_and_int8_falls_back():
    shape = LAYER_SHAPE + ["model=tiny-qwen2", "hardware=t4", "precision=fp16"]
    plain, qlora = estimate(shape + ["lora=r8"]), estimate(shape + ["lora=qlora"])
    assert qlora["method"] == "trace" and qlora["peak_reserved_bytes"] >= qlora["peak_allocated_bytes"]
    # the 4-bit weights' fp32 scales (one per 64 values): the closed form counts them with the weights, the
    # trace's tracker does not (neither does a real job's), the allocator model does (capture.py)
    scales = qlora["closed_form"]["breakdown"]["params"] - qlora["trace"]["breakdown"]["params"]
    assert scales > 0
    assert qlora["peak_allocated_bytes"] - qlora["peak_bytes"] >= scales
    assert qlora["peak_bytes"] < plain["peak_bytes"]
    int8 = estimate(shape + ["lora=int8"])
    assert int8["method"] == "closed_form" and "outlier" in int8["method_reason"]


@pytest.mark.slow  # a trace of a 1.2B-parameter model (about 20 s)
def test_closed_form_follows_the_trace_at_a_billion_parameters():
    for overrides in (["precision=bf16", "lora=r8", "optim=sgd"], ["precision=fp32", "optim=adamw_torch"]):
        est = estimate(["task=causal_lm", "model=llama-3.2-1b", "hardware=a100_40gb", "batch_size=4",
                        "max_seq_len=1024"] + overrides)
        assert est["total_params"] > 1.2e9
        assert_closed_form_near_trace(est, overrides, rel=0.05)


@pytest.mark.slow  # a trace of an 8B model (about 20 s)
def test_qlora_on_an_8b_model():
    est = estimate(["task=causal_lm", "model=llama-3.1-8b", "lora=qlora", "hardware=t4", "batch_size=1",
                    "max_seq_len=512"])
    assert est["method"] == "trace"
    assert est["closed_form"]["peak_bytes"] == pytest.approx(est["peak_allocated_bytes"], rel=0.05)
    closed = est["closed_form"]
    # 4-bit layer weights (~3.5 GB) beside the unquantized embedding and head, in fp32 under precision=fp32
    # (2 x 128,256 x 4,096 x 4 B = 4.2 GB): well under the 32 GB of fp32 weights; the logits of 128,256
    # tokens in fp32 (log_softmax's output and two gradients) on top
    head_and_embedding = 2 * 128256 * 4096 * 4
    assert head_and_embedding < closed["breakdown"]["params"] < head_and_embedding + 4e9
    assert closed["breakdown"]["activations"] > 3 * 512 * 128256 * 4
    assert closed["peak_bytes"] > closed["breakdown"]["params"]


# Real tiny jobs: the trace within 0.5 % of the measured peak, the closed form within 15 %
MEASURED = [["model=tiny-llama", "precision=fp32", "optim=adamw_8bit", "checkpointing=none", "lora=none"],
            ["model=tiny-qwen2", "precision=bf16", "optim=sgd", "checkpointing=full", "lora=r8"],
            ["model=tiny-gpt2", "precision=fp32", "optim=adafactor", "checkpointing=full", "lora=none"],
            ["model=tiny-llama", "precision=fp32", "optim=adamw", "checkpointing=full", "lora=qlora"],
            ["model=tiny-qwen2", "precision=fp32", "optim=paged_adamw_8bit", "checkpointing=none", "lora=int8"]]


@pytest.mark.slow  # five real jobs (bf16 is emulated on the CPU)
@pytest.mark.parametrize("overrides", MEASURED, ids=lambda o: "-".join(v.split("=")[1] for v in o))
def test_closed_form_predicts_real_decoder_jobs(overrides, tmp_path):
    res = run_job(GRID_SHAPE + [f"threads={THREADS}", "data.train_size=64", "data.eval_size=32", "max_steps=3"]
                  + overrides, tmp_path / "job")
    assert res["status"] == "ok", res["reason"]
    measured, est = res["memory"]["peak_bytes"], res["estimate"]
    assert est["closed_form"]["peak_bytes"] == pytest.approx(measured, rel=0.15), est["closed_form"]["phase"]
    # bitsandbytes' 8-bit state once measured 24,448 B (0.12 %) above the closed form on a fresh clone: not
    # explained, so the closed form's state is checked to 1 %, the trace's (the library's own code) to the byte
    assert est["closed_form"]["optimizer_bytes"] == pytest.approx(res["memory"]["optimizer_bytes"], rel=0.01)
    assert est["method"] == "trace" and est["optimizer_bytes"] == res["memory"]["optimizer_bytes"]
    assert est["trace"]["peak_bytes"] == pytest.approx(measured, rel=0.005)
