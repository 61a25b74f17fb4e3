"""estimate/scratch.py: the staging buffer PyTorch's CUDA reduction kernel takes from the caching allocator,
against a real H200 run's memory snapshot, and in the estimate: counted on a GPU, sized per GPU model, absent
on a CPU."""
import collections
import lzma
import pickle
from pathlib import Path

from conftest import TINY
from memsweep.estimate.scratch import Gpu, reduction_scratch

SNAPSHOT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_snapshots" / "h200_bert_run.pickle.xz"
SNAPSHOT_EXCERPTS = Path(__file__).resolve().parent / "snapshots"
H200, A100, T4 = Gpu(132, 2048), Gpu(108, 2048), Gpu(40, 1024)


def scratch_pairs() -> collections.Counter:
    """(block, next block) sizes of the snapshot's allocations where a block of over 1 MiB is followed at once
    by one of under 1 KiB: a reduction's staging buffer and its semaphores."""
    trace = pickle.load(lzma.open(SNAPSHOT))["device_traces"][0]
    allocs = [e["size"] for e in trace if e["action"] == "alloc"]
    return collections.Counter((a, b) for a, b in zip(allocs, allocs[1:]) if a > 2**20 and b < 1024)


def test_the_h200_snapshot_holds_the_bias_gradients_staging_buffers_as_predicted():
    # bert-base sized, fp32, micro-batch 32: the intermediate (3,072) and hidden (768) bias gradients, each
    # summed over the step's tokens, at 128 tokens and at a batch padded to its longest, 50
    pairs = scratch_pairs()
    for tokens in (128, 50):
        for width in (3072, 768):
            staging, semaphores = reduction_scratch((32, tokens, width), (0, 1), 4, H200)
            assert pairs[(staging, semaphores)] >= 12, (tokens, width)  # every layer's, every step's
    assert reduction_scratch((32, 128, 3072), (0, 1), 4, H200) == [100_663_296, 96]


def test_a_public_snapshot_holds_the_norm_weight_gradients_staging_buffers_as_predicted():
    # Wedsonlin/assignment2-systems (tests/snapshots/, MIT): a 24-layer decoder, d_model 1,024, fp32, batch 4,
    # its RMSNorm weights' gradients summed over the step's tokens: 2 per layer and the final norm's, 49
    import json

    from test_allocator_snapshots import recorded

    for tokens, expected in ((512, 49), (128, 0)):
        excerpt = json.loads((SNAPSHOT_EXCERPTS / f"wedsonlin_medium_{tokens}_training.json").read_text())
        sizes = [e.size for e in recorded(excerpt) if e.size is not None]  # the allocations
        made = reduction_scratch((4, tokens, 1024), (0, 1), 4, A100)  # the GPU is not stated: any with >= 16 SMs
        pairs = collections.Counter(zip(sizes, sizes[1:]))
        assert (pairs[tuple(made)] if made else 0) == expected, tokens
    assert reduction_scratch((4, 512, 1024), (0, 1), 4, T4) == [16_777_216, 32]


def test_the_split_depends_on_the_gpu_and_on_the_size():
    # fewer SMs, fewer resident threads: fewer blocks per output, a smaller buffer
    t4, a100 = (reduction_scratch((8, 1024, 4096), (0, 1), 4, g)[0] for g in (T4, A100))
    assert 0 < t4 < a100
    assert reduction_scratch((2, 8, 3072), (0, 1), 4, A100) == []  # a few tokens: no split across blocks
    assert reduction_scratch((8, 1024, 4096), (0, 2), 4, A100) == []  # a layout this reading leaves out
    # bf16 gradients accumulate in fp32: the same buffer as fp32's
    assert reduction_scratch((8, 1024, 4096), (0, 1), 4, A100)[0] == a100


def test_a_gpu_estimate_counts_the_scratch_and_sizes_it_for_each_gpu():
    from memsweep.app.estimate import compose
    from memsweep.config.hardware import load_profile
    from memsweep.estimate.core import estimate_job

    # 32 x 256 tokens: an A100 splits each bias gradient's sum over more blocks than a T4
    job = compose(TINY + ["model.hidden_size=256", "model.intermediate_size=1024", "batch_size=32",
                          "max_seq_len=256"])
    memo, a100, t4 = {}, load_profile("a100_40gb"), load_profile("t4")
    on_a100 = estimate_job(job, a100, memo)
    traced = next(iter(memo.values()))
    assert traced.reductions, "the bias gradients' sums are recorded"
    on_t4 = estimate_job(job, t4, memo)  # the same trace, read for a T4
    assert len(memo) == 1
    # the tensors are the same on both; what the allocator serves differs by the kernels' scratch
    assert on_a100.peak_bytes == on_t4.peak_bytes
    assert on_a100.peak_allocated_bytes > on_t4.peak_allocated_bytes > on_t4.peak_bytes
    alone = traced.for_any_gpu()
    assert estimate_job(job, t4, {next(iter(memo)): alone}).peak_allocated_bytes == on_t4.peak_allocated_bytes


def test_a_trace_made_on_a_hopper_gpu_reads_on_an_ampere_one_with_its_smaller_cublas_workspaces():
    from memsweep.app.estimate import compose
    from memsweep.config.hardware import load_profile
    from memsweep.estimate.core import estimate_job
    from memsweep.estimate.trace import workspace_bytes

    job = compose(TINY + ["model.hidden_size=256", "model.intermediate_size=1024", "batch_size=8", "max_seq_len=64"])
    h100, a100, memo = load_profile("h100"), load_profile("a100_40gb"), {}
    assert workspace_bytes(h100) > workspace_bytes(a100)  # 32 MiB on compute capability 9.0, 8,519,680 B before
    on_h100 = estimate_job(job, h100, memo)
    assert len(next(iter(memo.values())).cublas_keys) == 2  # the forward's and the backward's
    read_on_a100 = estimate_job(job, a100, memo)
    alone = estimate_job(job, a100)
    assert read_on_a100.peak_allocated_bytes == alone.peak_allocated_bytes < on_h100.peak_allocated_bytes
    assert read_on_a100.peak_reserved_bytes == alone.peak_reserved_bytes


def test_an_adjusted_trace_is_made_for_each_gpu():
    # ZeRO-2 is traced as its nearest job and adjusted; those events are not kept, so a T4 cannot reuse
    # the A100's reading: asked in one memo, the T4 gets what it gets alone
    from memsweep.app.estimate import compose
    from memsweep.config.hardware import load_profile
    from memsweep.estimate.core import estimate_job

    job = compose(TINY + ["model.hidden_size=256", "model.intermediate_size=1024", "batch_size=32",
                          "max_seq_len=256", "deepspeed=zero2", "precision=bf16"])
    a100, t4, memo = load_profile("a100_40gb"), load_profile("t4"), {}
    on_a100 = estimate_job(job, a100, memo)
    assert on_a100.method == "adjusted trace"
    assert estimate_job(job, t4, memo).peak_allocated_bytes == estimate_job(job, t4).peak_allocated_bytes
    assert estimate_job(job, t4).peak_allocated_bytes < on_a100.peak_allocated_bytes  # the T4's smaller scratch
