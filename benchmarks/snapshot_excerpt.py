"""A CUDA memory snapshot (torch.cuda.memory._dump_snapshot's pickle) as a small JSON excerpt the allocator
test replays (tests/test_allocator_snapshots.py): the segments that existed when recording started, with
the blocks then allocated; every allocation and free recorded (requested size, address); the addresses
cudaMalloc gave new segments; and what the snapshot ends with (reserved bytes, segments). `recorded` and
`start_segments` read an excerpt back as the allocator model takes it.

    python benchmarks/snapshot_excerpt.py SNAPSHOT.pickle OUT.json --repository owner/name \
        --path path/in/repo --commit SHA --licence "MIT (Copyright ...)" [--about "..."]

The pickle is checked with pickletools before it is loaded: only builtin types (dicts, lists, strings,
numbers), no opcode that could import or call anything.

How the start is rebuilt. A snapshot lists its segments and their blocks at the end, and the trace the
allocations and frees since recording began (device_traces; `size` is the requested size, as malloc and
free_block record it in CUDACachingAllocator.cpp). Segments present at the end and not made during the
trace (segment_alloc) existed at the start. A block was allocated at the start if the trace frees its
address before allocating it, or if it is still allocated at the end and the trace never allocated it
(then the end lists its exact size). A block freed without being allocated is known by its requested
size, rounded to 512 bytes (round_size); in the large pool a block is not split when the rest would be
1 MiB or less (should_split), and every cached block there is over 1 MiB (each comes from a request over
1 MiB, or a split rest over 1 MiB, and merging only grows them), so a gap of at most 1 MiB after it is
its own, and so is any gap up to the first later allocation that lands within 1 MiB past its rounded
size while it lives. What lies between the allocated blocks is cached: one block each, as merged.
"""
import argparse
import json
import pickle
import pickletools
from pathlib import Path
from typing import NamedTuple

from memsweep.estimate.allocator import StartBlock, StartSegment

MIB = 2**20
ROUND = 512  # kMinBlockSize
SMALL_SIZE = MIB  # kSmallSize
# opcodes that import, build or call something: none is needed for dicts, lists, strings and numbers
UNSAFE = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "BUILD", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2",
          "EXT4", "PERSID", "BINPERSID"}


def load_plain(path: Path):
    data = Path(path).read_bytes()
    found = {op.name for op, _, _ in pickletools.genops(data) if op.name in UNSAFE}
    if found:
        raise ValueError(f"{path}: not a plain pickle of builtin types ({sorted(found)})")
    return pickle.loads(data)


def rounded(nbytes: int) -> int:
    return max(ROUND, -(-nbytes // ROUND) * ROUND)


def live_at_start(trace: list, end_segments: list) -> dict[int, int]:
    """address -> size of each block allocated when recording started (its requested size rounded where
    only the trace knows it; the end's exact size where the block outlived the trace)."""
    seen, live = set(), {}
    for e in trace:
        if e["action"] == "alloc":
            seen.add(e["addr"])
        elif e["action"] == "free_completed" and e["addr"] not in seen and e["addr"] not in live:
            live[e["addr"]] = rounded(e["size"])
    for segment in end_segments:
        for b in segment["blocks"]:
            if b["state"] == "active_allocated" and b["address"] not in seen:
                live[b["address"]] = b["size"]
    return live


def next_allocation_within(trace: list, live: dict[int, int]) -> dict[int, int]:
    """For each start block, the first later allocation landing within 1 MiB past its rounded size while it
    lives: the next block begins there, so the start block ends there."""
    alive, found = set(live), {}
    for e in trace:
        if e["action"] == "free_completed":
            alive.discard(e["addr"])
        elif e["action"] == "alloc":
            for a in alive:
                if a + live[a] < e["addr"] <= a + live[a] + SMALL_SIZE:
                    found.setdefault(a, e["addr"])
    return found


def start_blocks(base: int, size: int, small: bool, live: dict[int, int], ends: dict[int, int]) -> list:
    """One segment's blocks at the start: [addr, size, allocated], covering it in address order."""
    inside = sorted(a for a in live if base <= a < base + size)
    blocks, pos = [], base
    for i, a in enumerate(inside):
        if a > pos:
            blocks.append([pos, a - pos, False])
        nbytes = live[a]
        gap = (inside[i + 1] if i + 1 < len(inside) else base + size) - (a + nbytes)
        if gap < 0:
            raise ValueError(f"blocks overlap at {a:#x}")
        if not small and 0 < gap <= SMALL_SIZE:
            nbytes += gap
        elif not small and gap > 0 and a in ends:
            nbytes = ends[a] - a
        blocks.append([a, nbytes, True])
        pos = a + nbytes
    if pos < base + size:
        blocks.append([pos, base + size - pos, False])
    return blocks


def excerpt(snapshot: dict, source: dict) -> dict:
    """The JSON excerpt of a one-device, one-stream snapshot."""
    traces = [t for t in snapshot["device_traces"] if t]
    if len(traces) != 1 or {e["stream"] for e in traces[0]} != {0} or \
            any(e["action"] == "segment_free" for e in traces[0]):
        raise ValueError("one device, its default stream, no segment released during the trace")
    trace, segments = traces[0], snapshot["segments"]
    made = [e["addr"] for e in trace if e["action"] == "segment_alloc"]
    live = live_at_start(trace, segments)
    ends = next_allocation_within(trace, live)
    start = [[s["address"], s["total_size"], s["segment_type"] == "small",
              start_blocks(s["address"], s["total_size"], s["segment_type"] == "small", live, ends)]
             for s in sorted(segments, key=lambda s: s["address"]) if s["address"] not in set(made)]
    events = [[e["addr"], e["size"]] if e["action"] == "alloc" else [e["addr"]]
              for e in trace if e["action"] in ("alloc", "free_completed")]
    return {"source": source, "start": start, "new_segments": made, "events": events,
            "end": {"reserved_bytes": sum(s["total_size"] for s in segments), "segments": len(segments),
                    "allocated_bytes": sum(s["allocated_size"] for s in segments)}}


class Recorded(NamedTuple):
    """One of an excerpt's events as `excerpt` stores it: [addr, size] the allocation of `size` requested bytes
    placed at `addr`, [addr] the free of the block there."""
    addr: int
    size: int | None = None  # None: a free


def recorded(excerpt: dict) -> list[Recorded]:
    """The excerpt's allocations and frees, in order."""
    return [Recorded(*entry) for entry in excerpt["events"]]


def start_segments(excerpt: dict) -> list[StartSegment]:
    """The segments that existed when recording started, as allocator.CachingAllocator.seed takes them: each
    block allocated then keyed by its address (its free names it so), the others cached."""
    return [StartSegment(base, size, small, [StartBlock(addr, nbytes, addr if allocated else None)
                                             for addr, nbytes, allocated in blocks])
            for base, size, small, blocks in excerpt["start"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("out", type=Path)
    for name in ("repository", "path", "commit", "licence"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--about", default="")
    args = parser.parse_args()
    source = {k: getattr(args, k) for k in ("repository", "path", "commit", "licence", "about")}
    out = excerpt(load_plain(args.snapshot), source)
    args.out.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"{args.out}: {len(out['events'])} events, {len(out['start'])} segments at the start, "
          f"{len(out['new_segments'])} made; ends with {out['end']}")


if __name__ == "__main__":
    main()
