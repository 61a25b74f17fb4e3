"""A row's figures per GPU, from the trace at full depth or, to keep a plan of hundreds of combinations
fast, from traces of the same model at two smaller depths, extrapolated.

Why depth extrapolation holds: a transformer's blocks are identical, so each block adds the same tensors
(its weights, gradients, optimizer state, saved activations) and the same ops to the step. Tensor bytes
at the peak, and the step's time, are affine in the number of blocks (the time exactly so where the device
or the host's dispatch paces every block); measured on Llama-3.1-8B bf16 at depths 2, 3, 4 and 32, the
peak tensor bytes extrapolated from 2 and 3 equal the full trace's to the byte. What the caching allocator reserves is not a sum over blocks (its segments
depend on the order of allocations), so reserved is taken as the extrapolated allocated peak times the
larger reserved/allocated ratio of the two traces (the fit errs on the safe side); tests/test_planner.py
checks each figure against the full trace.
"""
import dataclasses

from ..config.schema import Config, HardwareConf
from ..estimate.core import capacity_bytes
from ..estimate.meta import model_config
from . import batch, twin


def layers_of(job: Config) -> int:
    config, _ = model_config(job)
    return int(config.num_hidden_layers)


def figures(est, processes: int = 1) -> dict:
    """What a plan row reads from an estimate of one of the job's `processes` (each steps its share of the
    batch at once). Reserved on its safe side of packing, as the estimate's own fits and margin take it: a
    row that fits here fits in `mode=estimate` too."""
    allocated = (est.peak_allocated_bytes or est.peak_bytes) if est.device == "cuda" else est.peak_bytes
    reserved = (est.reserved_upper_bytes or est.peak_reserved_bytes) if est.device == "cuda" else est.peak_bytes
    return {"peak_bytes": est.peak_bytes, "allocated_bytes": allocated, "reserved_bytes": reserved,
            "overhead_bytes": est.overhead_bytes, "step_s": est.predicted_step_s,
            "why_not": est.step_time.get("why_not"), "time_note": est.step_time.get("note"),
            "tokens": est.micro_batch_size * est.accumulation_steps * est.seq_len * processes}


def with_fit(row: dict, profile: HardwareConf) -> dict:
    capacity = capacity_bytes(profile)
    total = row["reserved_bytes"] + row["overhead_bytes"]
    return {**row, "total_bytes": total, "capacity_bytes": capacity,
            "fits": None if capacity is None else total <= capacity,
            "margin_bytes": None if capacity is None else capacity - total,
            "tokens_per_s": row["tokens"] / row["step_s"] if row["step_s"] else None}


def extrapolated(low: dict, high: dict, depths: tuple[int, int], layers: int) -> dict:
    """Figures at `layers` blocks from those at two depths: affine in the blocks; reserved as allocated
    times the larger of the two traces' reserved / allocated."""
    scale = (layers - depths[0]) / (depths[1] - depths[0])

    def line(key):
        return low[key] + (high[key] - low[key]) * scale

    allocated = int(line("allocated_bytes"))
    ratio = max(low["reserved_bytes"] / low["allocated_bytes"], high["reserved_bytes"] / high["allocated_bytes"])
    step_s = line("step_s") if low["step_s"] and high["step_s"] else None
    return {**low, "peak_bytes": int(line("peak_bytes")), "allocated_bytes": allocated,
            "reserved_bytes": int(allocated * ratio), "step_s": step_s}


def row_figures(job: Config, profiles: list[HardwareConf], memo: dict, depths: list[int] | None) -> dict:
    """{profile name: figures with the fit}, and how they were made ("trace" or "trace at depths a, b, scaled")."""
    layers = layers_of(job)
    if not depths or layers <= max(depths):
        out = {p.name: with_fit(figures(shortcut_estimate(job, p, memo), job.distributed.world_size), p) for p in profiles}
        return {"per_gpu": out, "method": "trace" + derived_note(job, profiles[0], memo)}
    d = tuple(sorted(depths))
    at = {k: dataclasses.replace(job, model=dataclasses.replace(job.model, num_layers=k)) for k in d}
    out = {}
    for p in profiles:
        low, high = (figures(shortcut_estimate(at[k], p, memo), job.distributed.world_size) for k in d)
        out[p.name] = with_fit(extrapolated(low, high, d, layers), p)
    method = f"trace at {d[0]} and {d[1]} of {layers} blocks, scaled" + derived_note(at[d[0]], profiles[0], memo)
    return {"per_gpu": out, "method": method}


def shortcut_estimate(job: Config, profile: HardwareConf, memo: dict):
    """The job's estimate: from its precision twin's trace (twin.py), from two micro-batches' (batch.py), or traced."""
    return twin.from_twin(job, profile, memo) or batch.estimate_at_micro_batch(job, profile, memo)


def derived_note(job: Config, profile: HardwareConf, memo: dict) -> str:
    traced = memo.get(batch.device_key(job, profile), {})
    note = f"; micro-batch from those at {' and '.join(map(str, batch.BASES))} (batch.py)" if traced.get(
        "derived_from") else ""
    return note + (f"; the {traced['twin']} trace (twin.py)" if traced.get("twin") else "")
