"""The models of public CUDA memory snapshots (tests/snapshots/) as memsweep jobs, estimated and set against
what the snapshot's GPU allocated and reserved in the recorded step.

    python benchmarks/snapshot_jobs.py [128 512]

Wedsonlin/assignment2-systems records one training step of the CS336 "medium" decoder LM (24 layers,
d_model 1024, d_ff 4096, 16 heads, vocab 10,000, SwiGLU, RMSNorm, RoPE, untied head; fp32, no autocast;
batch 4) after five warm-up steps (cs336_systems/nsys_profile.py), gradients set to None before it.
Its job here: a Llama config.json of the same sizes (snapshot_models/cs336-medium/config.json: the same
423,183,360 parameters), task=causal_lm, fp32, eager attention, no gradient clipping, and torch's AdamW
stepping one parameter at a time as the course's AdamW does (foreach off: memsweep has no optimizer
setting for that, so this script turns it off where the estimate builds the optimizer). The GPU's figures
are the snapshot's own, replayed (tests/test_allocator_snapshots.py puts every block at its address):
peak allocated and reserved over the recorded step.

Known differences in the jobs themselves, not in the estimator: the course's model computes softmax,
SiLU and RMSNorm with its own elementwise ops (cs336_basics/model.py) and its AdamW makes new m and v
tensors and three temporaries per parameter (cs336_basics/optimizer.py lines 73-80) where torch's
updates them in place.
"""
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's memsweep
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
MIB = 2**20
CONFIG = ROOT / "benchmarks" / "snapshot_models" / "cs336-medium" / "config.json"
JOB = ["task=causal_lm", "model=llama-3.2-1b", f"model.config={CONFIG}", "mode=estimate", "precision=fp32",
       "optim=adamw_torch", "optim.max_grad_norm=0", "attention=eager", "hardware=a100_80gb", "batch_size=4"]


def measured(tokens: int) -> tuple[int, int]:
    """The snapshot's peak allocated and reserved bytes over its recorded step (its own events replayed)."""
    from test_allocator_snapshots import replay_excerpt

    excerpt = json.loads((ROOT / "tests" / "snapshots" / f"wedsonlin_medium_{tokens}_training.json").read_text())
    allocator, misplaced = replay_excerpt(excerpt)
    assert misplaced == 0
    return allocator.peak_allocated, allocator.peak_reserved


def estimated(tokens: int) -> dict:
    from memsweep.app.estimate import compose
    from memsweep.config import hardware, validate
    from memsweep.estimate import step
    from memsweep.estimate.core import estimate_job

    job = compose(JOB + [f"max_seq_len={tokens}"])
    validate.ranges(job)
    on_device = step.on_device
    step.on_device = lambda cls, kwargs, profile: {**on_device(cls, kwargs, profile), "foreach": False}
    try:
        return estimate_job(job, hardware.detect(job.hardware)).to_dict()
    finally:
        step.on_device = on_device


def main(lengths: list[int]) -> None:
    print("| tokens | allocated MiB (snapshot / estimate) | reserved MiB (snapshot / estimate / upper) |")
    print("|---|---|---|")
    for tokens in lengths:
        allocated, reserved = measured(tokens)
        est = estimated(tokens)
        a, r, u = est["peak_allocated_bytes"], est["peak_reserved_bytes"], est["reserved_upper_bytes"]
        print(f"| {tokens} | {allocated / MIB:,.0f} / {a / MIB:,.0f} ({100 * (a / allocated - 1):+.1f} %) | "
              f"{reserved / MIB:,.0f} / {r / MIB:,.0f} ({100 * (r / reserved - 1):+.1f} %) / {u / MIB:,.0f} "
              f"({100 * (u / reserved - 1):+.1f} %) |", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [128, 512])
