"""The trace on decoder LLMs: the tiny Llama, Qwen2 (tied head, q/k/v bias) and GPT-2 (fused Conv1D
q/k/v, dropout) decoders, against real measured jobs, at the scale of the shipped hub configs, and its
recorded allocations (what the allocator model and the adjustments read) against its own ledger.

Every comparison is with a figure computed here, never one written into the test.
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
    return core.estimate_job(*job_of(overrides)).to_dict()


def quantization_state_bytes(overrides) -> int:
    """Bytes of the 4-bit weights' block scales and codes: the recorder counts them (a GPU's allocator
    holds them), the ledger does not (neither parameters nor buffers)."""
    from memsweep.estimate import fake, meta
    from memsweep.estimate.capture import quantization_state
    from memsweep.run.setup import build_setup

    job, profile = job_of(overrides)
    setup = build_setup(job, profile)
    with fake.on_fake_tensors(meta.traced_model(job, setup), setup, profile) as model:
        tensors = {id(t): t for p in model.parameters() for t in quantization_state(p)}
        return sum(t.untyped_storage().nbytes() for t in tensors.values())


def assert_recorded_as_the_ledger(est, overrides):
    """The step's recorded allocations, read as the ledger reads a step, give the ledger's own peak (the
    same storages, born and dead at the same points), but for 4-bit block scales the ledger does not see."""
    assert est["method"] == "trace", (overrides, est["method_reason"])
    unseen = est["trace"]["recorded_peak_bytes"] - est["trace"]["peak_bytes"]
    if "lora=qlora" in overrides:
        assert 0 < unseen <= quantization_state_bytes(overrides), overrides
    else:
        assert unseen == 0, overrides


@pytest.mark.parametrize("model", MODELS)
def test_recorded_allocations_read_as_the_ledger_on_the_grid_shape(model):
    for overrides in SUBSET:
        est = estimate(GRID_SHAPE + [f"model={model}"] + overrides)
        assert_recorded_as_the_ledger(est, overrides)
        # FlopCounterMode on the traced step: every matmul weight (all but the input embedding, at most
        # half the parameters) used forward and at least once backward on each of the 4 x 32 tokens
        assert est["flops_per_step"] >= 2 * est["total_params"] * 4 * 32, overrides


@pytest.mark.parametrize("model", MODELS)
def test_recorded_allocations_read_as_the_ledger_where_the_layers_weigh(model):
    for overrides in SUBSET[:2] + SUBSET[3:5]:
        assert_recorded_as_the_ledger(estimate(LAYER_SHAPE + [f"model={model}"] + overrides), overrides)


def test_the_vocabulary_is_the_peak_on_the_grid_shape():
    # 30,522 tokens x 128 positions of logits: log_softmax's fp32 output and the two fp32 gradients of
    # the loss's backward are the largest tensors of the step, and the trace's peak holds them
    est = estimate(GRID_SHAPE + ["model=tiny-llama", "optim=sgd"])
    logits = 4 * 32 * 30522 * 4
    assert est["trace"]["breakdown"]["temp"] >= 2 * logits
    assert est["trace"]["breakdown"]["temp"] + est["trace"]["breakdown"]["activations"] >= 3 * logits


def test_gpu_profile_kernels():
    # bool dropout masks and the memory-efficient kernel (k, v repeated to every head under padding): less
    # than the CPU's float masks and math attention
    for model in ("tiny-llama", "tiny-gpt2"):
        for overrides in (["precision=bf16", "lora=r8"], ["precision=fp32", "attention=eager"]):
            common = LAYER_SHAPE + [f"model={model}", "optim=sgd"] + overrides
            gpu, cpu = estimate(common + ["hardware=a100_40gb"]), estimate(common + ["hardware=cpu"])
            assert_recorded_as_the_ledger(gpu, overrides)
            # (a GPU job copies its batch to the device inside the step: input ids, mask and labels, int64)
            batch = 3 * 4 * 128 * 8
            assert gpu["activations_bytes"] <= cpu["activations_bytes"] + batch, (model, overrides)
            # the allocator's whole blocks hold at least the tensors, and cuBLAS's two workspaces besides
            assert gpu["peak_allocated_bytes"] >= gpu["peak_bytes"] + 2 * 8_519_680


def saved_bytes_per_element(fn, x, cuda: bool) -> float:
    """Bytes autograd saves for backward per element of `x` when `fn` runs under the trace's bf16 CPU autocast,
    with CUDA autocast's float32 ops (`cuda`) or the CPU's own policy."""
    import contextlib

    import torch

    from memsweep.estimate import fake

    saved = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t))
        if cuda:
            stack.enter_context(fake.CudaAutocast())
        fn(x)
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in saved}.values()) / x.numel()


def test_a_gpu_profile_runs_cuda_autocasts_float32_ops():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers.activations import NewGELUActivation

    from memsweep.estimate import fake

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names += [func.__name__] if func.namespace == "aten" else []
            return func(*args, **(kwargs or {}))

    with FakeTensorMode():
        x = torch.randn(8, 64, dtype=torch.bfloat16, requires_grad=True)
        half = torch.randn(8, 64, dtype=torch.float16)
        # GPT-2's gelu_new: pow(x, 3) runs on an fp32 copy of x on a GPU, and keeps it; so tanh's output and the
        # factor made of it are fp32 too (4 bytes each; 2 on the CPU), beside 0.5 * x in bf16
        assert saved_bytes_per_element(NewGELUActivation(), x, cuda=False) == 2 + 2 + 2 + 2
        assert saved_bytes_per_element(NewGELUActivation(), x, cuda=True) == 4 + 4 + 2 + 4
        with torch.autocast("cpu", dtype=torch.bfloat16), fake.CudaAutocast():
            assert torch.softmax(x, -1).dtype == torch.float32 and x.softmax(-1, dtype=torch.bfloat16).dtype == x.dtype
            assert torch.nn.functional.layer_norm(x, (64,)).dtype == torch.float32
            with Ops() as ops:  # a half softmax reads fp16 and writes fp32 (ATen's half_to_float), bf16 is copied first
                assert torch.nn.functional.softmax(half, dim=-1).dtype == torch.float32
            assert ops.names == ["_softmax.default"]
            plain = x.detach()
            with Ops() as ops:
                torch.softmax(plain, -1)
            assert ops.names == ["_to_copy.default", "_softmax.default"]
            with torch.autocast("cpu", enabled=False):  # where a model turns autocast off, nothing changes
                assert torch.softmax(x, -1).dtype == torch.bfloat16
        with fake.CudaAutocast():
            assert torch.softmax(x, -1).dtype == torch.bfloat16


def test_classification_on_a_decoder():
    for model in ("tiny-llama", "tiny-gpt2"):
        for overrides in (["precision=fp32", "lora=none"], ["precision=bf16", "lora=r8", "checkpointing=full"]):
            shape = [o for o in LAYER_SHAPE if o != "task=causal_lm"] + ["task=classification"]
            est = estimate(shape + [f"model={model}", "optim=sgd"] + overrides)
            assert_recorded_as_the_ledger(est, overrides)
            assert est["trainable_params"] < est["total_params"] if "lora=r8" in overrides else True


def test_bitsandbytes_jobs_are_traced():
    # (on the CPU bitsandbytes trains 8-bit layers through MatMul8bitFp; a GPU profile runs MatMul8bitLt)
    for overrides in (["optim=adamw_8bit"], ["optim=paged_adamw_8bit"], ["lora=qlora"],
                      ["lora=qlora", "checkpointing=full", "precision=bf16"]):
        assert_recorded_as_the_ledger(estimate(LAYER_SHAPE + ["model=tiny-qwen2"] + overrides), overrides)
    adamw, eight_bit = (estimate(GRID_SHAPE + ["model=tiny-qwen2", f"optim={o}"]) for o in ("adamw", "adamw_8bit"))
    # the tied embedding keeps 32-bit states (Trainer), the layers' matrices 8-bit ones
    assert eight_bit["optimizer_bytes"] < adamw["optimizer_bytes"]


def test_on_a_gpu_paged_state_is_outside_the_allocator_and_inside_device_used():
    # bitsandbytes pages the state of each parameter of 1e5 elements or more (here the MLP's 256 x 704 and
    # the embedding's 1000 x 256, not the attention's 256 x 256) into unified memory, outside torch's counters
    shape = LAYER_SHAPE + ["model=tiny-qwen2", "hardware=t4", "precision=fp16"]
    plain, paged = (estimate(shape + [f"optim={o}"]) for o in ("adamw_8bit", "paged_adamw_8bit"))
    # the 8-bit states of the MLP's matrices (one byte a value, two moments), the embedding's 32-bit ones
    # (Trainer keeps an embedding's state in 32 bits): 3 x 4 layers x 256 x 704 x 2 B + 1000 x 256 x 8 B
    moved = paged["trace"]["paged_state_bytes"]
    assert plain["trace"]["paged_state_bytes"] == 0 and moved == 3 * 4 * 256 * 704 * 2 + 1000 * 256 * 8
    assert paged["optimizer_bytes"] == plain["optimizer_bytes"] - moved
    assert paged["peak_bytes"] == plain["peak_bytes"] - moved
    assert paged["peak_allocated_bytes"] == plain["peak_allocated_bytes"] - moved
    assert paged["device_used_bytes"] == paged["peak_reserved_bytes"] + paged["overhead_bytes"] + moved
    assert paged["device_used_upper_bytes"] >= paged["device_used_bytes"]
    # on a CPU bitsandbytes does not page (get_state_buffer falls back to torch.zeros_like)
    on_cpu = estimate(LAYER_SHAPE + ["model=tiny-qwen2", "precision=fp32", "optim=paged_adamw_8bit"])
    assert on_cpu["trace"]["paged_state_bytes"] == 0


def test_on_a_gpu_qlora_adds_the_block_scales_and_int8_runs_the_gpus_matmul():
    shape = LAYER_SHAPE + ["model=tiny-qwen2", "hardware=t4", "precision=fp16"]
    plain, qlora = estimate(shape + ["lora=r8"]), estimate(shape + ["lora=qlora"])
    assert qlora["method"] == "trace" and qlora["peak_reserved_bytes"] >= qlora["peak_allocated_bytes"]
    # the 4-bit weights' fp32 scales (one per 64 values): the trace's tracker does not count them (neither
    # does a real job's), the allocator model does (capture.py)
    scales = quantization_state_bytes(shape + ["lora=qlora"])
    assert scales > 0
    assert qlora["peak_allocated_bytes"] - qlora["peak_bytes"] >= scales
    assert qlora["peak_bytes"] < plain["peak_bytes"]
    # double quantization on fake tensors: 8-bit scales and their own fp32 ones, fewer bytes than fp32 scales
    double = shape + ["lora=qlora", "lora.double_quant=true"]
    assert_recorded_as_the_ledger(estimate(double), double)
    assert quantization_state_bytes(double) < scales
    # LLM.int8 through MatMul8bitLt, as on a GPU: the 8-bit weights are far smaller than LoRA's 16-bit base
    int8 = estimate(shape + ["lora=int8"])
    assert int8["method"] == "trace" and any("MatMul8bitLt" in note for note in int8["notes"])
    assert int8["trace"]["breakdown"]["params"] < 0.6 * plain["trace"]["breakdown"]["params"]


@pytest.mark.slow  # a trace of a 1.2B-parameter model (about 20 s)
def test_the_trace_at_a_billion_parameters():
    for overrides in (["precision=bf16", "lora=r8", "optim=sgd"], ["precision=fp32", "optim=adamw_torch"]):
        est = estimate(["task=causal_lm", "model=llama-3.2-1b", "hardware=a100_40gb", "batch_size=4",
                        "max_seq_len=1024"] + overrides)
        assert est["total_params"] > 1.2e9
        assert_recorded_as_the_ledger(est, overrides)


@pytest.mark.slow  # a trace of an 8B model (about 20 s)
def test_qlora_on_an_8b_model():
    est = estimate(["task=causal_lm", "model=llama-3.1-8b", "lora=qlora", "hardware=t4", "batch_size=1",
                    "max_seq_len=512"])
    assert est["method"] == "trace"
    # 4-bit layer weights (~3.5 GB) beside the unquantized embedding and head, in fp32 under precision=fp32
    # (2 x 128,256 x 4,096 x 4 B = 4.2 GB): well under the 32 GB of fp32 weights; the logits of 128,256
    # tokens in fp32 (log_softmax's output and two gradients) on top
    head_and_embedding = 2 * 128256 * 4096 * 4
    params = est["trace"]["breakdown"]["params"]
    assert head_and_embedding < params < head_and_embedding + 4e9
    assert est["peak_bytes"] - params > 3 * 512 * 128256 * 4
    assert est["peak_allocated_bytes"] >= est["peak_bytes"]


# Real tiny jobs: the trace within 0.5 % of the measured peak, the optimizer state to the byte
MEASURED = [["model=tiny-llama", "precision=fp32", "optim=adamw_8bit", "checkpointing=none", "lora=none"],
            ["model=tiny-qwen2", "precision=bf16", "optim=sgd", "checkpointing=full", "lora=r8"],
            ["model=tiny-gpt2", "precision=fp32", "optim=adafactor", "checkpointing=full", "lora=none"],
            ["model=tiny-llama", "precision=fp32", "optim=adamw", "checkpointing=full", "lora=qlora"],
            ["model=tiny-qwen2", "precision=fp32", "optim=paged_adamw_8bit", "checkpointing=none", "lora=int8"]]


@pytest.mark.slow  # five real jobs (bf16 is emulated on the CPU)
@pytest.mark.parametrize("overrides", MEASURED, ids=lambda o: "-".join(v.split("=")[1] for v in o))
def test_the_trace_predicts_real_decoder_jobs(overrides, tmp_path):
    res = run_job(GRID_SHAPE + [f"threads={THREADS}", "data.train_size=64", "data.eval_size=32", "max_steps=3"]
                  + overrides, tmp_path / "job")
    assert res["status"] == "ok", res["reason"]
    measured, est = res["memory"]["peak_bytes"], res["estimate"]
    assert est["method"] == "trace" and est["optimizer_bytes"] == res["memory"]["optimizer_bytes"]
    assert est["trace"]["peak_bytes"] == pytest.approx(measured, rel=0.005)
