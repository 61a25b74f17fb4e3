"""What a run reserves over many steps: the traced step's allocations replayed through the caching allocator
model (allocator.py) once per optimizer step of the run, each step's activations scaled to its own padded
length, in the order the job's sampler reads its data. One allocator over the whole run: blocks cached for
one step's sizes stay reserved when the next step's sizes do not fit them. The method, the mechanism and
its sources, and what is not modelled: docs/estimator/allocator.md ("Reserved over a run").
"""
import dataclasses
import random
import time
from collections.abc import Hashable
from typing import NamedTuple

from ..config.choices import DataSource, ModelSource
from ..config.schema import Config, HardwareConf
from ..run import procenv, task
from . import capture, scratch
from .allocator import CachingAllocator, replay
from .allocator_conf import Options
from .capture import AllocatorReading
from .events import Event
from .result import RunReserved
from .trace import for_gpu, reading_key
from .traced import Trace

# Where the estimate advises expandable segments: when the run reserves more than this fraction beyond one step at
# max_seq_len. The band validate-estimates holds every modelled row to (docs/estimator/validation.md: within
# +-10 %): fragmentation beyond it changes the answer by more than the estimate's own error.
ADVISE_ABOVE = 0.10

# The steps replayed: a run's first RUN_STEPS optimizer steps (and the longest, see run_lengths), every one of
# them while the events replayed stay within RUN_EVENTS (the allocator model runs ~0.25-0.35 million events a
# second on this CPU: a tiny decoder's 200 steps of ~1,300 events, a 7B decoder's first ~18 of ~17,000), after
# that only a step longer than every step before it (docs/estimator/allocator.md: where a run maps new memory).
RUN_STEPS = 200
RUN_EVENTS = 300_000


class RunLengths(NamedTuple):
    """Each replayed optimizer step's micro-batch lengths (padded tokens, as the collator pads them), and
    where they come from: "data" (the job's own examples, in its sampler's order) or "spread" (every
    length from 1 to max_seq_len equally likely, a seeded draw: where the data cannot be read offline)."""
    steps: list[tuple[int, ...]]
    source: str


class StepTemplate(NamedTuple):
    """The traced step split for replaying: what exists before it (loaded once), its own events, which of
    them scale with the step's length, the micro-batch each belongs to, and the blocks it leaves allocated
    (the batch's tensors, freed once the next batch replaces them)."""
    before: list[Event]
    step: list[Event]
    scales: list[bool]
    micro_batch: list[int]
    left: list[Hashable]


def varying_lengths(job: Config) -> bool:
    """Whether the job's steps differ in length: a text job whose batches are padded each to its longest
    example (not to a multiple that is max_seq_len or more: then every step is the traced one)."""
    multiple = job.data.pad_to_multiple_of
    return not task.images(job.task) and not (multiple and multiple >= job.max_seq_len)


def run_lengths(job: Config, setup) -> RunLengths:
    """The padded lengths of the run's first RUN_STEPS optimizer steps (of its first epoch), with a step at
    max_seq_len where the ledger pads one (the first step after warm-up, measure.warmup_steps) and else at the
    end: the longest step comes after shorter ones, the worst place for it in a history of cached blocks."""
    from ..run.train_loop import optimizer_steps

    examples, source = data_lengths(job), "data"
    if examples is None:
        examples, source = spread(job, setup), "spread"
    run = optimizer_steps(len(examples), setup.micro_batch_size, setup.accumulation_steps, setup.world_size,
                          job.epochs, job.max_steps)
    steps = padded_steps(examples, setup.micro_batch_size, setup.accumulation_steps, job.data.pad_to_multiple_of,
                         setup.group_by_length, job.seed)[:min(RUN_STEPS, run) - 1]
    longest = (job.max_seq_len,) * min(setup.accumulation_steps, 2)
    at = min(job.measure.warmup_steps, len(steps)) if job.measure.ledger else len(steps)
    return RunLengths(steps[:at] + [longest] + steps[at:], source)


def data_lengths(job: Config) -> list[int] | None:
    """The tokenised length of each training example, where the tokenizer and the data are on this machine
    (a shipped or tiny model's tokenizer, a local model folder; the embedded tweets or a local file); else
    None. The tokenised data is cached for the job (run/data.load)."""
    from pathlib import Path

    from ..run.train_loop import load_data

    local_model = job.model.source != ModelSource.hub or Path(job.model.tokenizer or job.model.path or "").is_dir()
    if not local_model or job.data.source not in (DataSource.tweets, DataSource.csv):
        return None
    try:
        _, data = load_data(job)
    except Exception:  # noqa: BLE001 - the job says what is wrong with its data when it loads it itself
        return None
    return [len(ids) for ids in data.train["input_ids"]]


def spread(job: Config, setup) -> list[int]:
    """Examples of every length from 1 to max_seq_len equally likely (job.seed): enough for RUN_STEPS steps."""
    draw = random.Random(job.seed)
    per_step = setup.micro_batch_size * setup.accumulation_steps * setup.world_size
    return [draw.randint(1, job.max_seq_len) for _ in range(RUN_STEPS * per_step)]


def padded_steps(lengths: list[int], micro_batch: int, accumulation: int, multiple: int | None, grouped: bool,
                 seed: int) -> list[tuple[int, ...]]:
    """The optimizer steps of one epoch as the job's sampler reads them (run/lengths.typical_padded_length's
    order), each micro-batch padded to its longest example (rounded up to `multiple`). Of each step: its first
    micro-batch and the longest of the others (the trace records two micro-batches; its second stands for
    the rest: step.RUN_MICRO_BATCHES)."""
    from ..run.lengths import padded_micro_batches

    padded = padded_micro_batches(lengths, micro_batch, accumulation, multiple, grouped, seed)
    steps = [padded[i:i + accumulation] for i in range(0, len(padded), accumulation)]
    return [(s[0],) if len(s) == 1 or accumulation == 1 else (s[0], max(s[1:])) for s in steps]


def template(events: list[Event], categories: dict) -> StepTemplate:
    """The traced step as replay_run takes it: its events from the first mark on; what is allocated as an
    activation scales with the tokens (packing_envelope's rule, capture.py)."""
    first = next(i for i, e in enumerate(events) if e.kind == "mark")
    before, step = events[:first], events[first:]
    micro_batch, n, live = [], -1, {}
    for e in step:
        n += e.is_mark("forward")
        micro_batch.append(max(n, 0))
        if e.kind == "alloc":
            live[e.key] = True
        elif e.kind in ("free", "free_completed"):
            live.pop(e.key, None)
    scales = [e.kind == "alloc" and categories.get(e.key, "activations") == "activations" for e in step]
    return StepTemplate(before, step, scales, micro_batch, list(live))


def replay_run(shape: StepTemplate, lengths: list[tuple[int, ...]], traced_len: int, options: Options) -> int:
    """max_memory_reserved over the steps: one allocator, the load once, then each step's events with its
    activations scaled to its micro-batches' lengths, the blocks it leaves freed before the next step.

    Between steps every block the step made is free again and merged with its free neighbours, so what is
    cached is fixed by the segments and the blocks from before the step: a step that maps no new memory
    leaves the allocator as it found it, and the same lengths again would too. Such a repeat is skipped; past
    RUN_EVENTS, so is a step no longer than the longest before it."""
    allocator = CachingAllocator(options)
    for event in shape.before:
        allocator.apply(event)
    unchanged: set[tuple[int, ...]] = set()  # lengths replayed since the allocator last changed
    replayed, longest = 0, 0
    for step in lengths:
        record, longest = max(step) > longest, max(longest, *step)
        if step in unchanged or (replayed > RUN_EVENTS and not record):
            continue
        replayed += len(shape.step)
        state = (allocator.reserved, allocator.segments, len(allocator.live))
        replay_step(allocator, shape, [length / traced_len for length in step])
        if state != (allocator.reserved, allocator.segments, len(allocator.live)):
            unchanged.clear()
        else:
            unchanged.add(step)
    return allocator.reading().peak_reserved_bytes


def replay_step(allocator: CachingAllocator, shape: StepTemplate, factors: list[float]) -> None:
    """One step's events, its activations scaled by its micro-batch's factor (the second stands for the rest)."""
    last = len(factors) - 1
    live, empty = allocator.live, allocator.empty
    for event, scales, n in zip(shape.step, shape.scales, shape.micro_batch):
        if scales:
            allocator.malloc(event.key, max(1, int(event.nbytes * factors[min(n, last)])))
        elif event.kind == "free":
            if event.key in live or event.key in empty:  # see held
                allocator.free(event.key)
        elif event.kind == "alloc":
            allocator.malloc(event.key, event.nbytes)
        elif event.kind != "reset_peak" and held(allocator, event):  # the peak is over the whole run
            allocator.apply(event)
    for key in shape.left:
        if key in live:
            allocator.free(key)


def held(allocator: CachingAllocator, event: Event) -> bool:
    """Whether a free is of a block the allocator holds: a block from before the step that the step frees
    (a gradient kept from the warm-up) is freed by the first replayed step only."""
    if event.kind in ("free", "free_requested"):
        return event.key in allocator.live or event.key in allocator.empty
    if event.kind == "free_completed":
        return event.key in allocator.pending or event.key in allocator.empty
    return True


def reserved_over_run(job: Config, setup, events: list[Event], categories: dict, one_step: dict[bool, int],
                      options: Options) -> RunReserved:
    """The run's reserved bytes with and without expandable segments (`one_step`: the traced step's own
    reserved bytes under each; `options`: the job's other allocator settings), never below one step's."""
    started, lengths = time.perf_counter(), run_lengths(job, setup)
    shape = template(events, categories)
    over = {on: max(one_step[on], replay_run(shape, lengths.steps, job.max_seq_len,
                                             dataclasses.replace(options, expandable_segments=on)))
            for on in (False, True)}
    flat = [n for s in lengths.steps for n in s]
    return RunReserved(steps=len(lengths.steps), lengths=lengths.source, shortest=min(flat), longest=max(flat),
                       one_step_reserved_bytes=one_step[False], reserved_bytes=over[False],
                       one_step_expandable_bytes=one_step[True], reserved_expandable_bytes=over[True],
                       expandable_segments=options.expandable_segments, seconds=round(time.perf_counter() - started, 2))


class DeviceReading(NamedTuple):
    """A GPU job's allocator readings: one step under the allocator settings the job runs with, and where its
    steps differ in length, the run's."""
    allocator: AllocatorReading
    over_run: RunReserved | None


def device_reading(job: Config, setup, traced: Trace, profile: HardwareConf, over_run: bool = True) -> DeviceReading:
    """The traced step's allocator reading on `profile`'s GPU under the job's settings (the process's
    PYTORCH_CUDA_ALLOC_CONF, with expandable segments where the job's key says so), and over the run where
    the job's steps differ in length (unless not `over_run`). A trace that keeps no events (an adjusted job's)
    gives for_gpu's reading."""
    reading = for_gpu(traced, profile).allocator
    if traced.events is None:
        return DeviceReading(reading, None)
    conf = procenv.alloc_conf_for(job.expandable_segments, capture.alloc_conf())
    events = gpu_events(traced, profile)
    if conf != capture.alloc_conf():
        reading = capture.allocator_reading(events, traced.categories, conf)
    if not (over_run and varying_lengths(job)):
        return DeviceReading(reading, None)
    options = Options.parse(conf)
    one_step = {on: replay(events, dataclasses.replace(options, expandable_segments=on)).peak_reserved_bytes
                for on in (False, True)}
    return DeviceReading(reading, reserved_over_run(job, setup, events, traced.categories, one_step, options))


def gpu_events(traced: Trace, profile: HardwareConf) -> list[Event]:
    """The traced step's events sized for `profile`'s GPU, as trace.for_gpu sizes them: each reduction's
    scratch for its SM count, the cuBLAS workspaces for its compute capability."""
    gpu, workspace = reading_key(profile)
    cublas = set(traced.cublas_keys or ())
    return [e._replace(nbytes=workspace) if e.kind == "alloc" and e.key in cublas else e
            for e in scratch.sized(traced.events, traced.reductions, gpu)]


def advice(over: RunReserved | None) -> list[str]:
    """One line advising expandable segments where the run's fragmentation is beyond ADVISE_ABOVE of one step
    and expandable segments reserve less over the run; none otherwise."""
    if over is None or over.expandable_segments or over.reserved_expandable_bytes >= over.reserved_bytes:
        return []
    if over.fragmentation_bytes <= ADVISE_ABOVE * over.one_step_reserved_bytes:
        return []
    gib = 2**30
    return [f"advice: steps of {over.shortest}-{over.longest} tokens leave the caching allocator "
            f"{over.fragmentation_bytes / gib:.2f} GiB reserved beyond one step at max_seq_len "
            f"({over.reserved_bytes / gib:.2f} GiB over {over.steps} steps); expandable_segments=true "
            f"(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) is predicted to reserve "
            f"{over.reserved_expandable_bytes / gib:.2f} GiB"]
