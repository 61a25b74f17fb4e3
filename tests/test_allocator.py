"""The CUDA caching allocator model (estimate/allocator.py) on sequences whose reserved size follows
from PyTorch's rules by hand; every expected number is worked out in the test from those rules, not
read off the model."""
import pytest

from memsweep.estimate.allocator import replay
from memsweep.estimate.allocator_conf import MIB, Options
from memsweep.estimate.events import Event

KIB = 2**10
SMALL_SEGMENT = 2 * MIB  # kSmallBuffer: the small pool's segments
LARGE_SEGMENT = 20 * MIB  # kLargeBuffer: the segment of a 1-10 MiB request


alloc, free = Event.alloc, Event.free


def test_one_byte_reserves_a_small_segment():
    r = replay([alloc("a", 1)])
    assert r.peak_allocated_bytes == 512  # rounded up to kMinBlockSize
    assert r.peak_reserved_bytes == SMALL_SEGMENT and r.segments == 1


def test_small_requests_share_a_small_segment_until_it_is_full():
    # 600 KiB is a multiple of 512 (1200 x 512): no rounding. 3 x 600 = 1800 KiB fit in 2048 KiB: the
    # first splits the segment, the next two are cut from what is left of it.
    three = replay([alloc(i, 600 * KIB) for i in range(3)])
    assert three.peak_allocated_bytes == 1800 * KIB
    assert three.peak_reserved_bytes == SMALL_SEGMENT and three.segments == 1
    # the fourth (2048 - 1800 = 248 KiB left) needs a second segment
    assert replay([alloc(i, 600 * KIB) for i in range(4)]).peak_reserved_bytes == 2 * SMALL_SEGMENT


def test_a_one_mib_request_is_small_and_fills_half_a_small_segment():
    # kSmallSize (1 MiB) itself still goes to the small pool; the 1 MiB remainder serves the second exactly
    assert replay([alloc(i, MIB) for i in range(2)]).peak_reserved_bytes == SMALL_SEGMENT
    assert replay([alloc(i, MIB) for i in range(3)]).peak_reserved_bytes == 2 * SMALL_SEGMENT


def test_a_request_between_1_and_10_mib_takes_a_20_mib_segment_and_the_next_is_split_from_it():
    first = replay([alloc("a", 3 * MIB // 2)])
    assert first.peak_reserved_bytes == LARGE_SEGMENT and first.peak_allocated_bytes == 3 * MIB // 2
    # 20 - 1.5 = 18.5 MiB left (> kSmallSize, so the segment was split): the second fits in it
    two = replay([alloc("a", 3 * MIB // 2), alloc("b", 3 * MIB // 2)])
    assert two.peak_reserved_bytes == LARGE_SEGMENT and two.segments == 1
    assert two.peak_allocated_bytes == 3 * MIB


def test_a_large_request_reserves_itself_rounded_to_2_mib():
    assert replay([alloc("a", 30 * MIB)]).peak_reserved_bytes == 30 * MIB
    odd = replay([alloc("a", 31 * MIB)])
    assert odd.peak_reserved_bytes == 32 * MIB  # kRoundLarge
    # the 1 MiB left is not more than kSmallSize, so the block is not split: all 32 MiB count as allocated
    assert odd.peak_allocated_bytes == 32 * MIB


def test_the_large_pool_splits_only_a_remainder_above_1_mib():
    # 19 MiB asks for a 20 MiB segment (rounded to 2 MiB); 1 MiB left is not > kSmallSize: not split
    assert replay([alloc("a", 19 * MIB)]).peak_allocated_bytes == 20 * MIB
    # 18.5 MiB leaves 1.5 MiB: split, and a 1.5 MiB request is served from it without a new segment
    split = replay([alloc("a", 18 * MIB + MIB // 2), alloc("b", 3 * MIB // 2)])
    assert split.peak_allocated_bytes == 20 * MIB and split.peak_reserved_bytes == 20 * MIB


def test_a_freed_block_is_reused_by_a_smaller_request():
    # 30 MiB freed, then 25 MiB: the cached block serves it (5 MiB left > 1 MiB: split)
    r = replay([alloc("a", 30 * MIB), free("a"), alloc("b", 25 * MIB)])
    assert r.reserved_bytes == r.peak_reserved_bytes == 30 * MIB
    assert r.allocated_bytes == 25 * MIB
    # 29.5 MiB leaves 0.5 MiB: not split, the whole 30 MiB block is allocated
    assert replay([alloc("a", 30 * MIB), free("a"), alloc("b", 29 * MIB + MIB // 2)]).allocated_bytes == 30 * MIB


def test_a_block_another_stream_still_uses_is_reused_only_once_that_use_completes():
    # record_stream: 30 MiB freed while another stream reads it. allocated_bytes falls at the free, the
    # block is not cached yet: a second 30 MiB is a new segment; once completed, a third reuses the first
    r = replay([alloc("a", 30 * MIB), Event.free_requested("a"), alloc("b", 30 * MIB), Event.free_completed("a"),
                alloc("c", 30 * MIB)])
    assert r.peak_reserved_bytes == 60 * MIB and r.segments == 2
    assert r.peak_allocated_bytes == 60 * MIB and r.allocated_bytes == 60 * MIB
    held = replay([alloc("a", 30 * MIB), Event.free_requested("a"), alloc("b", 30 * MIB)])
    assert held.allocated_bytes == 30 * MIB and held.peak_allocated_bytes == 30 * MIB


def test_a_block_awaiting_another_stream_does_not_merge_with_its_freed_neighbour():
    # a and b, 5 MiB each, cut from one 20 MiB segment. a awaits another stream; b freed merges with the
    # 10 MiB rest only (15 MiB): 18 MiB needs a new segment. Completed, a merges back: 20 MiB serve 18
    start = [alloc("a", 5 * MIB), alloc("b", 5 * MIB), Event.free_requested("a"), free("b")]
    assert replay(start + [alloc("c", 18 * MIB)]).peak_reserved_bytes == 20 * MIB + 18 * MIB
    assert replay(start + [Event.free_completed("a"), alloc("c", 18 * MIB)]).peak_reserved_bytes == 20 * MIB


def test_the_smallest_free_block_that_fits_is_taken_not_the_first():
    # 40 MiB then 30 MiB, both freed. 25 MiB takes the 30 MiB block (best fit), so 35 MiB still finds
    # the 40 MiB one: 70 MiB reserved. First fit by address would cut 25 from the 40 and need a new
    # 36 MiB segment for the 35.
    r = replay([alloc("a", 40 * MIB), alloc("b", 30 * MIB), free("a"), free("b"),
                alloc("c", 25 * MIB), alloc("d", 35 * MIB)])
    assert r.reserved_bytes == 70 * MIB and r.segments == 2


@pytest.mark.fast
def test_freed_neighbours_merge_back_into_one_block():
    # two 5 MiB blocks cut from one 20 MiB segment, freed: they merge with the 10 MiB rest into 20 MiB,
    # which serves an 18 MiB request. Unmerged, the largest free piece would be 10 MiB.
    r = replay([alloc("a", 5 * MIB), alloc("b", 5 * MIB), free("a"), free("b"), alloc("c", 18 * MIB)])
    assert r.reserved_bytes == LARGE_SEGMENT and r.segments == 1


def test_blocks_of_different_segments_never_merge():
    # two 30 MiB segments freed side by side cannot serve 40 MiB: a third segment is allocated
    r = replay([alloc("a", 30 * MIB), alloc("b", 30 * MIB), free("a"), free("b"), alloc("c", 40 * MIB)])
    assert r.reserved_bytes == 100 * MIB and r.segments == 3


# A training step in miniature: 100 MiB of weights; the forward keeps four 30 MiB activations (each a
# segment of its own), the backward frees them and allocates a 100 MiB gradient.
STEP = ([alloc("w", 100 * MIB)] + [alloc(f"act{i}", 30 * MIB) for i in range(4)]
        + [free(f"act{i}") for i in range(4)] + [alloc("grad", 100 * MIB)])


def test_gradients_that_fit_no_cached_activation_block_reserve_more_than_the_allocated_peak():
    r = replay(STEP)
    assert r.peak_allocated_bytes == 100 * MIB + 4 * 30 * MIB  # end of the forward
    # the four freed 30 MiB segments stay cached and cannot hold 100 MiB: it is a new segment
    assert r.peak_reserved_bytes == 100 * MIB + 4 * 30 * MIB + 100 * MIB
    assert r.peak_reserved_bytes > r.peak_allocated_bytes


def test_expandable_segments_close_that_gap():
    # One growing segment in 20 MiB pages. Weights: 100 MiB = 5 pages. Activation 1: 2 pages (40),
    # 10 MiB left free at the end; activation 2 uses those 10 and maps 1 page more; 3 and 4 repeat
    # that: 100 + 4 x 30 = 220 MiB mapped, all allocated. Freed, the activations merge into one 120 MiB
    # block, which holds the 100 MiB gradient: nothing more is mapped.
    r = replay(STEP, Options(expandable_segments=True))
    assert r.peak_allocated_bytes == 220 * MIB
    assert r.peak_reserved_bytes == 220 * MIB and r.segments == 1


def test_expandable_segments_grow_in_whole_pages():
    # small pool: 2 MiB pages; large pool: 20 MiB pages, so 30 MiB maps 40 and the next 10 MiB fit
    expandable = Options(expandable_segments=True)
    assert replay([alloc("a", 1)], expandable).peak_reserved_bytes == 2 * MIB
    assert replay([alloc("a", 30 * MIB)], expandable).peak_reserved_bytes == 40 * MIB
    assert replay([alloc("a", 30 * MIB), alloc("b", 10 * MIB)], expandable).peak_reserved_bytes == 40 * MIB
    # 45 MiB: the 10 MiB free at the end are used and 40 more mapped (35 rounded up to 2 pages)
    assert replay([alloc("a", 30 * MIB), alloc("b", 45 * MIB)], expandable).peak_reserved_bytes == 80 * MIB


def test_expandable_best_fit_passes_over_the_block_that_can_grow():
    # a: 12 MiB (maps 20, 8 free at the end); b: 20 MiB (uses the 8, maps 20 more: 40 mapped, 8 free at
    # the end again); a freed: free blocks are 8 (at the end) and 12. A 6 MiB request would best fit
    # the 8, but the block at the end counts as the size it can grow to, so the 12 is cut instead
    # (6 + 6 free). Then 12 MiB fits in no free block: the end block (8) grows by one page: 60 mapped.
    # (Had the 6 MiB come from the end block, the 12 would have fitted in a's old block: 40 mapped.)
    r = replay([alloc("a", 12 * MIB), alloc("b", 20 * MIB), free("a"), alloc("c", 6 * MIB), alloc("d", 12 * MIB)],
               Options(expandable_segments=True))
    assert r.peak_reserved_bytes == 60 * MIB


def test_max_split_size_keeps_large_blocks_whole():
    base = [alloc("a", 100 * MIB), free("a")]
    # default: the cached 100 MiB is split for a 50 MiB request
    assert replay(base + [alloc("b", 50 * MIB)]).reserved_bytes == 100 * MIB
    capped = Options(max_split_size=40 * MIB)
    # 50 >= 40: an unsplittable block may serve it only if smaller than 50 + 20 (max_non_split_rounding)
    assert replay(base + [alloc("b", 50 * MIB)], capped).reserved_bytes == 150 * MIB
    # 30 < 40: an oversize (>= 40) block never serves it; 30 MiB gets a segment of its own
    assert replay(base + [alloc("b", 30 * MIB)], capped).reserved_bytes == 130 * MIB
    # a 70 MiB block serves 60 (70 < 60 + 20) whole: all 70 count as allocated
    r = replay([alloc("a", 70 * MIB), free("a"), alloc("b", 60 * MIB)], capped)
    assert r.reserved_bytes == 70 * MIB and r.allocated_bytes == 70 * MIB
    # a larger rounding allowance lets the 100 MiB block serve 50 (100 < 50 + 60), unsplit
    roomy = Options(max_split_size=40 * MIB, max_non_split_rounding=60 * MIB)
    assert replay(base + [alloc("b", 50 * MIB)], roomy).allocated_bytes == 100 * MIB


def test_options_parse_pytorch_cuda_alloc_conf():
    assert Options.parse(None) == Options()
    assert Options.parse("expandable_segments:True,max_split_size_mb:40") == Options(40 * MIB, 20 * MIB, True)
    assert Options.parse("max_non_split_rounding_mb:64,garbage_collection_threshold:0.6") == Options(None, 64 * MIB)
    with pytest.raises(ValueError, match=">= 20"):
        Options.parse("max_split_size_mb:10")


def test_reset_peak_starts_the_peaks_from_what_is_held_now():
    r = replay([alloc("a", 30 * MIB), free("a"), Event.reset_peak(), alloc("b", 10 * MIB)])
    assert r.peak_allocated_bytes == 10 * MIB  # the 30 MiB before the reset no longer counts
    assert r.peak_reserved_bytes == 30 * MIB  # but its segment is still reserved


def test_a_zero_byte_tensor_takes_no_block():
    r = replay([alloc("a", 0), free("a"), alloc("b", 0)])
    assert r.peak_reserved_bytes == 0 and r.segments == 0


# --- capture.py: the allocations of a step on fake tensors, against MemTracker on the same step

def live_peak(events):
    """The peak of the bytes alive, straight from the events (no allocator rules)."""
    sizes, current, peak = {}, 0, 0
    for event in events:
        if event.kind == "alloc":
            sizes[event.key] = event.nbytes
            current += event.nbytes
            peak = max(peak, current)
        elif event.kind == "free":
            current -= sizes.pop(event.key)
    return peak


@pytest.mark.parametrize("width,batch", [(1024, 64), (4096, 256)])
def test_capture_sees_what_memtracker_sees_on_a_linear_step(width, batch):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from memsweep.estimate.capture import Recorder

    with FakeTensorMode():
        model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
        recorder, tracker = Recorder(model.parameters()), MemTracker()
        tracker.track_external(model)
        with recorder, tracker:
            x = torch.randn(batch, width)  # made inside both, so both count it
            model(x).sum().backward()
        peak = max(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values())
    assert live_peak(recorder.events) == peak  # the same storages, born and dead at the same points
    # the allocator's peak adds only the rounding to 512 bytes: every tensor here is a multiple of
    # 4 KiB except the 4-byte loss and its gradient
    assert replay(recorder.events).peak_allocated_bytes == pytest.approx(peak, rel=0.001)


def test_capture_frees_a_storage_when_its_last_view_dies():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memsweep.estimate.capture import Recorder

    with FakeTensorMode():
        recorder = Recorder()
        with recorder:
            t = torch.zeros(1000)
            view = t.view(10, 100)
            del t
            alive = list(recorder.events)
            del view
        assert alive == [alloc(0, 4000)]
        assert recorder.events == [alloc(0, 4000), free(0)]


def test_a_gpu_profile_estimate_reports_what_the_allocator_reserves():
    from omegaconf import OmegaConf

    from conftest import compose_config
    from memsweep.config import hardware
    from memsweep.estimate import capture, core

    def estimate(overrides):
        job = OmegaConf.to_object(compose_config(["model=tiny", "optim=adamw", "batch_size=16", "max_seq_len=128",
                                                  *overrides]))
        return core.estimate_job(job, hardware.detect(job.hardware)).to_dict()

    t4 = estimate(["hardware=t4"])
    model = t4["trace"]["allocator"]
    # whole blocks: a little more than the tensor bytes the ledger counts plus cuBLAS's workspace,
    # and reserved above both
    workspaces = capture.CUDA_WORKSPACES_PER_STEP * capture.cublas_workspace_bytes()
    assert model["peak_allocated_bytes"] == pytest.approx(t4["trace"]["peak_bytes"] + workspaces, rel=0.03)
    assert t4["peak_reserved_bytes"] == model["peak_reserved_bytes"] > model["peak_allocated_bytes"]
    assert t4["peak_reserved_bytes"] % (2 * MIB) == 0  # whole 2 MiB / 20 MiB segments
    # what must fit the card: device used = reserved + the CUDA context
    assert t4["device_used_bytes"] == t4["peak_reserved_bytes"] + t4["overhead_bytes"]
    # fits and the margin take reserved on the safe side of packing
    assert t4["total_bytes"] == t4["device_used_upper_bytes"] == t4["reserved_upper_bytes"] + t4["overhead_bytes"]
    assert t4["reserved_upper_bytes"] >= t4["peak_reserved_bytes"]
    assert "peak_reserved_bytes" not in estimate(["hardware=cpu"])


def test_cublas_workspace_is_a_block_alive_through_the_step(monkeypatch):
    import torch

    from memsweep.estimate import capture

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert capture.cublas_workspace_bytes() == 4096 * 1024 * 2 + 16 * 1024 * 8 == 8_519_680
    # Hopper's default, as an H200 step's snapshot shows it; other GPUs keep the common one
    assert capture.cublas_workspace_bytes(9.0) == 32 * 2**20 and capture.cublas_workspace_bytes(8.0) == 8_519_680
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert capture.cublas_workspace_bytes() == 32 * 2**20
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8")
    assert capture.cublas_workspace_bytes(9.0) == 8_519_680  # the variable wins over the default
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    model = torch.nn.Linear(4, 4)
    with capture.Recorder(capture.alive_at_step(model, torch.optim.SGD(model.parameters()),
                                                capture.cublas_workspace_bytes())) as recorder:
        pass
    sizes = [e.nbytes for e in recorder.events if e.kind == "alloc"]
    # weight, bias, then the training thread's and the autograd thread's workspaces (no state for SGD)
    assert sizes == [64, 16, 8_519_680, 8_519_680]
    assert [recorder.categories[e.key] for e in recorder.events] == ["params", "params", "workspace", "workspace"]


def test_a_4bit_weight_brings_its_block_scales_and_8bit_state_its_maps_once():
    import bitsandbytes as bnb
    import torch

    from memsweep.estimate import capture
    from memsweep.techniques import optim

    layer = bnb.nn.Linear4bit(256, 128, bias=False, quant_type="nf4")
    layer.weight = bnb.nn.Params4bit(torch.randn(128, 256), requires_grad=False, quant_type="nf4",
                                    compress_statistics=False).to("cpu")  # as lora=qlora: no double quantization
    head = torch.nn.Linear(128, 4096, bias=False)
    model = torch.nn.Sequential(layer, head)
    with optim.own_bitsandbytes_overrides():  # none left by the jobs other tests ran in this process
        optimizer = bnb.optim.AdamW8bit(head.parameters())
        head(torch.randn(2, 128)).sum().backward()
        optimizer.step()
    workspace = capture.cublas_workspace_bytes()
    with capture.Recorder(capture.alive_at_step(model, optimizer, workspace)) as recorder:
        pass
    sizes = [e.nbytes for e in recorder.events if e.kind == "alloc"]
    # packed 4-bit weight, one fp32 scale per 64 values, the 16-value NF4 code; the head's weight;
    # the workspace, the head's gradient; its two uint8 states, two block-scale vectors and two maps once
    assert sizes[:6] == [128 * 256 // 2, 128 * 256 // 64 * 4, 16 * 4, 4096 * 128 * 4, workspace, workspace]
    state = sorted(sizes[7:])
    assert state == sorted([4096 * 128] * 2 + [4096 * 128 // 256 * 4] * 2 + [256 * 4] * 2), state


def test_a_storage_resized_in_place_frees_its_block_and_takes_one_of_the_new_size():
    # FSDP frees and re-gathers its unsharded parameters with Storage.resize_, which no op dispatch sees
    import torch

    from memsweep.estimate import capture

    weight = torch.empty(1024)
    with capture.Recorder([weight]) as recorder:
        weight.untyped_storage().resize_(0)
        weight.untyped_storage().resize_(8192)
        fresh = torch.empty(0)
        fresh.untyped_storage().resize_(2048)  # first seen at its new size
    assert recorder.events == [alloc(0, 4096), free(0), alloc(1, 8192), alloc(2, 2048)]
