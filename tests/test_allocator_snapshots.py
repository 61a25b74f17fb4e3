"""The caching allocator model (estimate/allocator.py) against real GPUs: public CUDA memory snapshots
(torch.cuda.memory._dump_snapshot) replayed through it, event by event. Each excerpt in tests/snapshots/
(made by benchmarks/snapshot_excerpt.py; its source repository, path, commit and licence inside) holds
the segments that existed when recording started, every allocation (requested size, address) and free
recorded, and the addresses cudaMalloc gave new segments. The model must put every block where the GPU
put it and end with the snapshot's reserved bytes, segments and allocated bytes."""
import json
import sys
from pathlib import Path

import pytest

from memsweep.estimate.allocator import CachingAllocator
from memsweep.estimate.allocator_conf import Options
from memsweep.estimate.events import Event

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # also run by snapshot_jobs.py
from snapshot_excerpt import recorded, start_segments  # noqa: E402

SNAPSHOTS = sorted((Path(__file__).parent / "snapshots").glob("*.json"))


def replay_excerpt(excerpt: dict, addresses: bool = True) -> tuple[CachingAllocator, int]:
    """Replay the recorded events on the allocator as recording found it (the start's segments); returns the
    allocator and how many blocks landed elsewhere than on the GPU."""
    allocator = CachingAllocator(Options(), iter(excerpt["new_segments"]) if addresses else None)
    start = start_segments(excerpt)
    allocator.seed(start)
    keys = {block.addr: block.key for segment in start for block in segment.blocks if block.key is not None}
    misplaced = 0
    for n, entry in enumerate(recorded(excerpt)):
        if entry.size is None:
            allocator.apply(Event.free(keys.pop(entry.addr)))
            continue
        key = keys[entry.addr] = ("event", n)
        allocator.apply(Event.alloc(key, entry.size))
        misplaced += allocator.live[key].addr != entry.addr
    return allocator, misplaced


@pytest.fixture(params=SNAPSHOTS, ids=[p.stem for p in SNAPSHOTS])
def excerpt(request):
    return json.loads(request.param.read_text())


def test_the_excerpts_are_there_and_name_their_source():
    assert len(SNAPSHOTS) >= 3
    for path in SNAPSHOTS:
        source = json.loads(path.read_text())["source"]
        assert source["repository"] and source["path"] and len(source["commit"]) == 40 and source["licence"]


def test_a_snapshot_replays_to_its_reserved_bytes_segments_and_every_address(excerpt):
    allocator, misplaced = replay_excerpt(excerpt)
    end = excerpt["end"]
    assert misplaced == 0
    assert allocator.reserved == allocator.peak_reserved == end["reserved_bytes"]
    assert allocator.segments == end["segments"]
    assert allocator.allocated == end["allocated_bytes"]


def test_without_the_gpus_addresses_the_reserved_bytes_still_match(excerpt):
    # the model's own addresses (new segments at increasing addresses) only break ties between cached
    # blocks of one size: the reserved bytes and segments do not depend on them here
    allocator, _ = replay_excerpt(excerpt, addresses=False)
    assert allocator.reserved == excerpt["end"]["reserved_bytes"]
    assert allocator.segments == excerpt["end"]["segments"]


def test_the_replay_tells_a_wrong_rule_apart(monkeypatch):
    # the large pool's rule of leaving a rest of 1 MiB or less unsplit (should_split) shows: a model that
    # splits every rest puts blocks where the GPU did not, and counts less allocated than the GPU did
    monkeypatch.setattr(CachingAllocator, "_should_split", lambda self, block, size: block.size - size >= 512)
    for name in ("decomfl_memory", "wedsonlin_medium_512_training"):
        excerpt = json.loads(next(p for p in SNAPSHOTS if p.stem == name).read_text())
        allocator, misplaced = replay_excerpt(excerpt)
        assert misplaced > 0 and allocator.allocated < excerpt["end"]["allocated_bytes"]
