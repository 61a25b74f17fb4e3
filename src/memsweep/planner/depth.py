"""A row's figures on each GPU (`Figures`), from the trace at full depth or, to keep a plan of hundreds of
combinations fast, from traces of the same model at two smaller depths, extrapolated: a transformer's blocks
are identical, so the step's tensor bytes and time are affine in their number. Why that holds, and how
reserved is taken: docs/planner.md; tests/test_planner.py checks each figure against the full trace."""
import dataclasses

from ..config.schema import Config, HardwareConf
from ..estimate.core import capacity_bytes
from ..estimate.meta import model_config
from ..run import task
from . import batch, twin


@dataclasses.dataclass(frozen=True)
class Figures:
    """What a plan row reads from an estimate of one of the job's processes on a GPU (`figures`), and how that
    fits the GPU's capacity (`with_fit`)."""
    peak_bytes: int
    allocated_bytes: int
    reserved_bytes: int  # on the safe side of packing, as the estimate's own fit takes it
    overhead_bytes: int  # the CUDA context
    step_s: float | None  # one optimizer step; None with why_not
    why_not: str | None  # why the step has no time
    time_note: str | None  # what a step's time leaves out (it is then a lower bound)
    tokens: int | None  # of one optimizer step, over every process; None for images (no tokens)
    capacity_bytes: int | None = None  # the GPU's (with_fit); None where it states none
    paged_bytes: int = 0  # bitsandbytes' paged optimizer state: on the GPU, outside the allocator

    @property
    def total_bytes(self) -> int:
        """What nvidia-smi would show: reserved, the context and the paged state."""
        return self.reserved_bytes + self.overhead_bytes + self.paged_bytes

    @property
    def fits(self) -> bool | None:
        return None if self.capacity_bytes is None else self.total_bytes <= self.capacity_bytes

    @property
    def margin_bytes(self) -> int | None:
        return None if self.capacity_bytes is None else self.capacity_bytes - self.total_bytes

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.step_s if self.step_s and self.tokens else None


@dataclasses.dataclass(frozen=True)
class RowFigures:
    """A combination's figures at one micro-batch on each GPU, and how they were made."""
    per_gpu: dict[str, Figures]  # by profile name
    method: str  # "trace" or "trace at a and b of n blocks, scaled", then the shortcuts taken (derived_note)


def layers_of(job: Config) -> int:
    config, _ = model_config(job)
    return int(config.num_hidden_layers)


def figures(est, processes: int = 1, images: bool = False) -> Figures:
    """What a plan row reads from an estimate of one of the job's `processes` (each steps its share of the
    batch at once). Reserved on its safe side of packing, as the estimate's own fits and margin take it: a
    row that fits here fits in `mode=estimate` too. `images`: an image task's step counts no tokens."""
    allocated = (est.peak_allocated_bytes or est.peak_bytes) if est.device == "cuda" else est.peak_bytes
    reserved = (est.reserved_upper_bytes or est.peak_reserved_bytes) if est.device == "cuda" else est.peak_bytes
    return Figures(peak_bytes=est.peak_bytes, allocated_bytes=allocated, reserved_bytes=reserved,
                   overhead_bytes=est.overhead_bytes, step_s=est.predicted_step_s,
                   why_not=est.step_time.why_not, time_note=est.step_time.note,
                   tokens=None if images else est.micro_batch_size * est.accumulation_steps * est.seq_len * processes,
                   paged_bytes=est.trace["paged_state_bytes"] if est.device == "cuda" else 0)


def with_fit(figures: Figures, profile: HardwareConf) -> Figures:
    """The figures on the profile's GPU: its capacity, so their fit and margin."""
    return dataclasses.replace(figures, capacity_bytes=capacity_bytes(profile))


def extrapolated(low: Figures, high: Figures, depths: tuple[int, int], layers: int) -> Figures:
    """Figures at `layers` blocks from those at two depths: affine in the blocks; reserved as allocated
    times the larger of the two traces' reserved / allocated."""
    shallow, deep = depths
    scale = (layers - shallow) / (deep - shallow)

    def line(at_low, at_high):
        return at_low + (at_high - at_low) * scale

    allocated = int(line(low.allocated_bytes, high.allocated_bytes))
    ratio = max(low.reserved_bytes / low.allocated_bytes, high.reserved_bytes / high.allocated_bytes)
    step_s = line(low.step_s, high.step_s) if low.step_s and high.step_s else None
    return dataclasses.replace(low, peak_bytes=int(line(low.peak_bytes, high.peak_bytes)),
                               allocated_bytes=allocated, reserved_bytes=int(allocated * ratio), step_s=step_s,
                               paged_bytes=int(line(low.paged_bytes, high.paged_bytes)))


def row_figures(job: Config, profiles: list[HardwareConf], memo: dict, depths: list[int] | None) -> RowFigures:
    """The job's figures with their fit on each GPU, and how they were made: its trace, or, where the model has
    more blocks than the larger of `depths`, traces at the two depths, scaled."""
    layers, processes, images = layers_of(job), job.distributed.world_size, task.images(job.task)
    if not depths or layers <= max(depths):
        per_gpu = {p.name: with_fit(figures(shortcut_estimate(job, p, memo), processes, images), p) for p in profiles}
        return RowFigures(per_gpu=per_gpu, method="trace" + derived_note(job, profiles[0], memo))
    shallow, deep = sorted(depths)
    at = {k: dataclasses.replace(job, model=dataclasses.replace(job.model, num_layers=k)) for k in (shallow, deep)}
    per_gpu = {}
    for p in profiles:
        low, high = (figures(shortcut_estimate(at[k], p, memo), processes, images) for k in (shallow, deep))
        per_gpu[p.name] = with_fit(extrapolated(low, high, (shallow, deep), layers), p)
    method = f"trace at {shallow} and {deep} of {layers} blocks, scaled" + derived_note(at[shallow], profiles[0], memo)
    return RowFigures(per_gpu=per_gpu, method=method)


def shortcut_estimate(job: Config, profile: HardwareConf, memo: dict):
    """The job's estimate: from its precision twin's trace (twin.py), from two micro-batches' (batch.py), or traced."""
    return twin.from_twin(job, profile, memo) or batch.estimate_at_micro_batch(job, profile, memo)


def derived_note(job: Config, profile: HardwareConf, memo: dict) -> str:
    """The shortcuts the job's trace on the profile took: its micro-batch from two others' (batch.py), or its
    precision twin's trace (twin.py)."""
    note = f"; micro-batch from those at {' and '.join(map(str, batch.BASES))} (batch.py)" if batch.derived(
        job, profile, memo) else ""
    traced = memo.get(batch.device_key(job, profile))  # the memo holds a Trace per job as its device sees it
    return note + (f"; the {traced.twin} trace (twin.py)" if traced is not None and traced.twin else "")
