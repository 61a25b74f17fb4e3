"""What a run reserves over many steps of varying length (estimate/run_replay.py): the caching allocator model
replayed over the run's steps, with and without expandable segments; `fits` on it; the expandable_segments key
in the job's environment. Every figure compared is computed here."""
import dataclasses

import pytest

from conftest import TINY, job_of
from memsweep.estimate import core, run_replay
from memsweep.estimate.allocator_conf import MIB, Options
from memsweep.estimate.events import Event
from memsweep.estimate.result import RunReserved
from memsweep.run import procenv
from surfaces import assert_refused, refusal, train_py

# A tiny decoder on a CUDA profile, one example per step, its data's own lengths (the embedded tweets, a few to
# about a hundred tokens) up to 512; without the ledger's step padded to max_seq_len (that step early in the run
# caches blocks for every shorter step: tested below).
DECODER = ["task=causal_lm", "model=tiny-llama", "hardware=a100_40gb", "batch_size=1", "max_seq_len=512",
           "logger=none", "precision=bf16"]
VARYING = DECODER + ["measure.ledger=false"]
GIB = 2**30


@pytest.fixture(scope="module")
def own_allocator_settings():
    """The estimate reads this process's allocator settings: none here, whatever the shell set."""
    with pytest.MonkeyPatch.context() as mp:
        for name in procenv.ALLOC_CONF_VARIABLES:
            mp.delenv(name, raising=False)
        yield


@pytest.fixture(scope="module")
def varying(own_allocator_settings):
    return core.estimate_job(*job_of(VARYING))


@pytest.mark.fast
def test_the_run_reserves_at_least_one_step_and_more_over_a_spread_of_lengths(varying):
    over = varying.over_run
    assert over is not None and over.lengths == "data" and over.longest == 512 and over.shortest < 64
    assert over.one_step_reserved_bytes == varying.peak_reserved_bytes  # the same step, the same allocator
    assert over.reserved_bytes > over.one_step_reserved_bytes
    assert over.reserved_expandable_bytes >= over.one_step_expandable_bytes
    assert "over_run" in varying.to_dict() and varying.to_dict()["over_run"]["reserved_bytes"] == over.reserved_bytes


def test_expandable_segments_reserve_less_over_the_run(varying):
    over = varying.over_run
    assert over.reserved_expandable_bytes < over.reserved_bytes


def test_fits_uses_what_the_run_reserves(varying, own_allocator_settings):
    over, context = varying.over_run, varying.overhead_bytes
    packing = varying.trace["allocator"]["reserved_upper_bytes"]  # the one-step upper figure (packing_envelope)
    assert varying.reserved_upper_bytes == max(packing, over.reserved_bytes) > packing
    assert varying.total_bytes == varying.device_used_upper_bytes == varying.reserved_upper_bytes + context
    # a capacity between one step's upper figure and the run's: one step fits, the run does not
    between = (max(packing, over.reserved_expandable_bytes) + over.reserved_bytes) / 2 + context
    assert packing + context < between < over.reserved_bytes + context
    capped = core.estimate_job(*job_of(VARYING + [f"hardware.memory_gib={between / GIB}"]))
    assert capped.fits is False
    # with expandable segments the job reserves what that replay says, and fits
    expandable = core.estimate_job(*job_of(VARYING + [f"hardware.memory_gib={between / GIB}",
                                                      "expandable_segments=true"]))
    assert expandable.over_run.expandable_segments and expandable.fits is True
    assert expandable.peak_reserved_bytes == over.one_step_expandable_bytes
    assert expandable.reserved_upper_bytes >= expandable.over_run.reserved_expandable_bytes
    # the run's figure is left out on request (the planner's rows): the one-step figures only
    single = core.estimate_job(*job_of(VARYING), over_run=False)
    assert single.over_run is None and single.reserved_upper_bytes == packing


def test_the_ledgers_longest_step_early_caches_blocks_for_the_shorter_ones(varying, own_allocator_settings):
    """A real job pads its ledger's step (the first after warm-up) to max_seq_len: the steps after it are
    served from what it cached, so the run reserves no more than with the longest last."""
    with_ledger = core.estimate_job(*job_of(DECODER)).over_run
    assert with_ledger.one_step_reserved_bytes <= with_ledger.reserved_bytes < varying.over_run.reserved_bytes


def test_a_job_of_one_length_has_no_run_replay(own_allocator_settings):
    est = core.estimate_job(*job_of(VARYING + ["data.pad_to_multiple_of=512"]))
    assert est.over_run is None and est.reserved_upper_bytes == est.trace["allocator"]["reserved_upper_bytes"]


def step_of(nbytes: int) -> run_replay.StepTemplate:
    """A step that allocates one activation of `nbytes` at the traced length and frees it."""
    events = [Event.alloc("weights", 40 * MIB), Event.mark("forward"), Event.alloc("act", nbytes),
              Event.mark("backward"), Event.free("act"), Event.mark("end")]
    return run_replay.template(events, {"weights": "params", "act": "activations"})


def test_rising_lengths_map_new_segments_and_expandable_segments_grow_one():
    """Each step longer than the last needs a block no cached one fits: the default allocator maps a new
    segment beside the cached ones (alloc_block), an expandable segment maps only the pages it lacks."""
    shape, rising = step_of(100 * MIB), [(n,) for n in (64, 128, 192, 256)]
    one = run_replay.replay_run(shape, [(256,)], 256, Options())
    assert run_replay.replay_run(shape, rising, 256, Options()) == 40 * MIB + (26 + 50 + 76 + 100) * MIB
    assert one == 140 * MIB
    assert run_replay.replay_run(shape, rising, 256, Options(expandable_segments=True)) == 140 * MIB
    # the longest first: every later step splits its cached block
    assert run_replay.replay_run(shape, rising[::-1], 256, Options()) == one


def test_advice_only_where_fragmentation_is_beyond_the_estimates_own_band():
    base = RunReserved(steps=200, lengths="spread", shortest=1, longest=4096, one_step_reserved_bytes=100 * GIB // 100,
                       reserved_bytes=100 * GIB // 100, one_step_expandable_bytes=GIB, reserved_expandable_bytes=GIB,
                       expandable_segments=False)
    assert run_replay.advice(base) == []
    small = dataclasses.replace(base, reserved_bytes=int(GIB * (1 + run_replay.ADVISE_ABOVE * 0.9)))
    assert run_replay.advice(small) == []
    large = dataclasses.replace(base, reserved_bytes=2 * GIB)
    assert len(run_replay.advice(large)) == 1 and "expandable_segments=true" in run_replay.advice(large)[0]
    assert run_replay.advice(dataclasses.replace(large, expandable_segments=True)) == []


@pytest.mark.parametrize("shell, key, runs_with", [
    (None, True, "expandable_segments:True"),
    ("max_split_size_mb:128", True, "max_split_size_mb:128,expandable_segments:True"),
    ("expandable_segments:False,max_split_size_mb:128", True, "max_split_size_mb:128,expandable_segments:True"),
    ("max_split_size_mb:128", False, "max_split_size_mb:128"),
    (None, False, None),
])
def test_the_key_reaches_the_jobs_environment_and_its_ranks(monkeypatch, shell, key, runs_with):
    monkeypatch.setattr(procenv, "_ALLOC_CONF_BEFORE", None)
    for name in procenv.ALLOC_CONF_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if shell is not None:
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", shell)
    job, _ = job_of(TINY + [f"expandable_segments={str(key).lower()}"])
    procenv.use_allocator(job)
    import os

    assert os.environ.get("PYTORCH_CUDA_ALLOC_CONF") == runs_with
    assert procenv.without_group_variables().get("PYTORCH_CUDA_ALLOC_CONF") == runs_with  # torchrun's ranks
    procenv.use_allocator(dataclasses.replace(job, expandable_segments=False))  # the next job of the sweep
    assert os.environ.get("PYTORCH_CUDA_ALLOC_CONF") == shell
    assert Options.parse(procenv.alloc_conf_for(True, shell)).expandable_segments


def test_the_variable_the_allocator_reads_first_is_the_one_set(monkeypatch):
    monkeypatch.setattr(procenv, "_ALLOC_CONF_BEFORE", None)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    job, _ = job_of(TINY + ["expandable_segments=true"])
    procenv.use_allocator(job)
    import os

    assert os.environ["PYTORCH_ALLOC_CONF"] == "max_split_size_mb:64,expandable_segments:True"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


def test_a_bad_value_is_refused_in_one_line(tmp_path, capsys, no_work):
    assert_refused(refusal(lambda: train_py(TINY + ["expandable_segments=maybe"], tmp_path / "job"), capsys),
                   "expandable_segments", "allowed: true or false")
