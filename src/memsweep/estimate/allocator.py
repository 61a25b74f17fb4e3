"""A model of PyTorch's CUDA caching allocator: what a GPU *reserves* for a recorded step's events.

The trace counts tensor bytes (torch.cuda.max_memory_allocated), but a GPU fills up with what the caching
allocator reserves (max_memory_reserved): requests rounded and packed into segments, freed blocks cached for
whatever fits them next. `replay` runs a step's events (events.Event) through DeviceCachingAllocator's rules
(c10/cuda/CUDACachingAllocator.cpp, each rule's function named where it is modelled) and returns both peaks.
What is modelled and what is not, and the sources: docs/estimator/allocator.md.
"""
from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from .allocator_conf import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    Options,
)
from .events import Event

# Note [Expandable Segments]: "we use 2MiB pages for our small pool and 20MiB pages for our large
# pool" (find_expandable_block: segment_size = pool->is_small ? kSmallBuffer : kLargeBuffer).
SMALL_PAGE, LARGE_PAGE = K_SMALL_BUFFER, K_LARGE_BUFFER

# An expandable segment reserves virtual address space for 1 1/8 of the GPU's memory and maps pages
# into it on demand; its unmapped rest only needs to be larger than any block (see _best_fit).
ADDRESS_SPACE = 2**50


def round_size(nbytes: int) -> int:
    """round_size: up to a multiple of kMinBlockSize (roundup_power2_divisions, off by default, not modelled)."""
    return max(K_MIN_BLOCK_SIZE, -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """get_allocation_size: what one cudaMalloc asks for when no cached block fits `size`."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER  # "requests between 1MB and 10MB will allocate and split a 20MB block"
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


@dataclass(eq=False, slots=True)
class Segment:
    """One cudaMalloc, or one expandable segment (`size` is then what is mapped of it)."""
    small: bool
    base: int
    size: int
    expandable: bool = False
    last: Block | None = None  # the block at its end (an expandable segment grows after it)


@dataclass(eq=False, slots=True)
class Block:
    """A piece of a segment: allocated, or cached in its pool. prev/next are its neighbours in the segment."""
    addr: int
    size: int
    segment: Segment
    allocated: bool = False
    prev: Block | None = None
    next: Block | None = None


class Cached(NamedTuple):
    """A free block in its pool, where BlockComparatorSize sorts it: by size, then address."""
    size: int
    addr: int
    block: Block


@dataclass
class Pool:
    """BlockPool: the free blocks of the small or the large pool, in BlockComparatorSize's order
    (size, then address; one stream), so the first one not smaller than a request is the best fit."""
    small: bool
    free: list[Cached] = field(default_factory=list)  # sorted
    expandable: Segment | None = None

    def insert(self, block: Block) -> None:
        bisect.insort(self.free, Cached(block.size, block.addr, block))

    def remove(self, block: Block) -> None:
        i = bisect.bisect_left(self.free, (block.size, block.addr))
        assert self.free[i].block is block
        del self.free[i]


@dataclass(frozen=True)
class Reading:
    """What the allocator's statistics would say after the events (torch.cuda.memory_stats)."""
    peak_allocated_bytes: int  # torch.cuda.max_memory_allocated: whole blocks, so rounding and unsplit slack count
    peak_reserved_bytes: int  # torch.cuda.max_memory_reserved
    allocated_bytes: int  # at the end
    reserved_bytes: int  # at the end (never below the peak here: nothing is released)
    segments: int  # cudaMallocs, or expandable segments with mapped memory


class StartBlock(NamedTuple):
    """A block of a segment that exists before the events start: allocated under `key`, or cached (None)."""
    addr: int
    nbytes: int
    key: Hashable = None


class StartSegment(NamedTuple):
    """A segment that exists before the events start: its blocks cover it in address order."""
    base: int
    size: int
    small: bool
    blocks: list[StartBlock]


class CachingAllocator:
    def __init__(self, options: Options = Options(), addresses: Iterator[int] | None = None):
        self.options = options
        self.addresses = addresses  # where each new cudaMalloc lands, when known (a recorded snapshot's)
        self.max_split = options.max_split_size if options.max_split_size is not None else float("inf")
        self.pools = {True: Pool(small=True), False: Pool(small=False)}
        self.live: dict = {}  # key -> its Block
        self.pending: dict = {}  # key -> its Block: freed, not yet reusable (free_requested)
        self.empty: set = set()  # keys of 0-byte allocations, which never get a block
        self.next_addr = 0
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = self.segments = 0

    def malloc(self, key, nbytes: int) -> None:
        if nbytes == 0:  # NativeCachingAllocator::allocate calls malloc only `if (size != 0)`
            self.empty.add(key)
            return
        size = round_size(nbytes)
        pool = self.pools[size <= K_SMALL_SIZE]  # get_pool
        # malloc: first a cached block (get_free_block), else new device memory (alloc_block)
        block = self._best_fit(pool, size) or self._new_memory(pool, size)
        if self._should_split(block, size):
            self._split(pool, block, size)
        block.allocated = True
        self.live[key] = block
        self.allocated += block.size  # alloc_found_block: allocated_bytes grows by the whole block
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key) -> None:
        """free_block: the block goes back to its pool, merged with free neighbours in its segment
        (try_merge_blocks); the memory stays reserved (only empty_cache or memory pressure release it)."""
        if key in self.empty:
            self.empty.discard(key)
            return
        block = self.live.pop(key)
        self.allocated -= block.size
        self._cache(block)

    def free_requested(self, key) -> None:
        """free of a block another stream still uses (Tensor.record_stream): allocated_bytes falls now, but
        the block is not cached until the events recorded on those streams complete (insert_events); it
        keeps its place in its segment, so a free neighbour cannot merge into it meanwhile."""
        if key in self.empty:
            return
        block = self.live.pop(key)
        self.allocated -= block.size
        self.pending[key] = block

    def free_completed(self, key) -> None:
        """process_events: the other streams' events done, free_block returns the block to its pool."""
        if key in self.empty:
            self.empty.discard(key)
            return
        self._cache(self.pending.pop(key))

    def _cache(self, block: Block) -> None:
        block.allocated = False
        pool = self.pools[block.segment.small]
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._merge(pool, block, neighbour)
        pool.insert(block)

    def seed(self, segments: Iterable[StartSegment]) -> None:
        """Segments that exist before the events start (a snapshot recorded part-way through a run). A block
        with a key is allocated (and freed later by that key), one without is cached; neighbouring cached
        blocks are one block: free_block merges them."""
        for start in segments:
            segment, prev = Segment(start.small, start.base, start.size), None
            for piece in start.blocks:
                block = Block(piece.addr, piece.nbytes, segment, allocated=piece.key is not None, prev=prev)
                if prev is not None:
                    prev.next = block
                if piece.key is None:
                    self.pools[start.small].insert(block)
                else:
                    self.live[piece.key] = block
                    self.allocated += piece.nbytes
                prev = block
            segment.last = prev
            self.next_addr = max(self.next_addr, start.base + start.size)
            self.segments += 1
            self._reserve(start.size)
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def apply(self, event: Event) -> None:
        """One event of a step: a block allocated or freed, or the peaks reset; the rest (marks, gradients)
        are not the allocator's."""
        if event.kind == "alloc":
            self.malloc(event.key, event.nbytes)
        elif event.kind == "free":
            self.free(event.key)
        elif event.kind == "free_requested":
            self.free_requested(event.key)
        elif event.kind == "free_completed":
            self.free_completed(event.key)
        elif event.kind == "reset_peak":
            self.reset_peak()

    def reset_peak(self) -> None:
        """resetPeakStats (torch.cuda.reset_peak_memory_stats): peaks start again from the current values."""
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def reading(self) -> Reading:
        return Reading(self.peak_allocated, self.peak_reserved, self.allocated, self.reserved, self.segments)

    def _best_fit(self, pool: Pool, size: int) -> Block | None:
        """get_free_block: the smallest cached block that fits (lower_bound in size order), within the
        max_split_size rules, else None."""
        i = bisect.bisect_left(pool.free, (size, -1))
        if i == len(pool.free):
            return None
        block = pool.free[i].block
        if block.segment.expandable and block is block.segment.last and i + 1 < len(pool.free):
            # "for the purposes of 'best fit' we consider its size to be the size it can expand to":
            # the block at an expandable segment's end can grow into the unmapped rest, so the next
            # larger block is taken instead when there is one.
            block = pool.free[i + 1].block
        # "Do not return an oversized block for a large request"
        if size < self.max_split <= block.size:
            return None
        # "Allow oversized block size to be rounded up but within a limit" (max_non_split_rounding)
        if size >= self.max_split and block.size >= size + self.options.max_non_split_rounding:
            return None
        pool.remove(block)
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        """should_split: the small pool (and every expandable segment) splits whenever the remainder
        can hold a minimal block; the large pool only below max_split_size and when the remainder is
        more than kSmallSize (a smaller one would belong in the small pool)."""
        remaining = block.size - size
        if block.segment.small or self.options.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.max_split and remaining > K_SMALL_SIZE

    def _new_memory(self, pool: Pool, size: int) -> Block:
        if self.options.expandable_segments:
            return self._expand(pool, size)
        # alloc_block: one cudaMalloc of get_allocation_size, a segment of its own
        nbytes = allocation_size(size)
        base = next(self.addresses) if self.addresses is not None else self.next_addr
        segment = Segment(pool.small, base, nbytes)
        block = segment.last = Block(base, nbytes, segment)
        self.next_addr = max(self.next_addr, base + nbytes)
        self.segments += 1
        self._reserve(nbytes)
        return block

    def _expand(self, pool: Pool, size: int) -> Block:
        """try_allocate_expandable_block: one segment per pool grows at its end. find_expandable_block
        starts from the free block at the end if there is one ("there might be a free segment we can
        also use right before it"), and map_block maps what is still missing, in whole pages."""
        page = SMALL_PAGE if pool.small else LARGE_PAGE
        segment = pool.expandable
        if segment is None:
            segment = pool.expandable = Segment(pool.small, self.next_addr, 0, expandable=True)
            self.next_addr += ADDRESS_SPACE
            self.segments += 1
        end = segment.last
        free_end = end if end is not None and not end.allocated else None
        grow = -(-(size - (free_end.size if free_end else 0)) // page) * page
        if free_end is not None:
            pool.remove(free_end)
            free_end.size += grow
            block = free_end
        else:
            block = Block(segment.base + segment.size, grow, segment, prev=end)
            if end is not None:
                end.next = block
            segment.last = block
        segment.size += grow
        self._reserve(grow)
        return block

    def _split(self, pool: Pool, block: Block, size: int) -> None:
        """alloc_found_block: the front of the block serves the request, the rest goes back to the pool."""
        rest = Block(block.addr + size, block.size - size, block.segment, prev=block, next=block.next)
        if block.next is not None:
            block.next.prev = rest
        block.next, block.size = rest, size
        if block.segment.last is block:
            block.segment.last = rest
        pool.insert(rest)

    def _merge(self, pool: Pool, block: Block, other: Block) -> None:
        pool.remove(other)
        if other is block.prev:
            block.addr, block.prev = other.addr, other.prev
            if block.prev is not None:
                block.prev.next = block
        else:
            block.next = other.next
            if block.next is not None:
                block.next.prev = block
        block.size += other.size
        if block.segment.last is other:
            block.segment.last = block

    def _reserve(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)


def replay(events: Iterable[Event], options: Options = Options()) -> Reading:
    """Run a step's events through the allocator (marks and gradient events are not the allocator's)."""
    allocator = CachingAllocator(options)
    for event in events:
        allocator.apply(event)
    return allocator.reading()
