"""A recorded step as the allocator model and the adjustments read it: one `Event` per allocation, free,
phase mark, accumulated gradient or peak reset, in the order they happened (docs/estimator/allocator.md)."""
from collections.abc import Hashable
from typing import NamedTuple

# A block's events, as memory snapshots name them (TraceEntry: alloc, free_requested, free_completed): "free"
# is a free that completes at once, the only kind on one stream.
BLOCK_EVENTS = ("alloc", "free", "free_requested", "free_completed")


class Event(NamedTuple):
    """One step of a recording. `kind` says which: a block's event (BLOCK_EVENTS) names the block by `key`
    and an allocation its size in `nbytes`; "mark" says where the step is (`name`: forward, backward, step,
    end); "grad" says a parameter's gradient was accumulated (`name`: the parameter, `key`: the block holding
    the gradient, None when none is known); "reset_peak" starts the allocator's peaks again."""
    kind: str
    key: Hashable = None
    nbytes: int = 0
    name: str | None = None

    @classmethod
    def alloc(cls, key: Hashable, nbytes: int) -> "Event":
        return cls("alloc", key, nbytes)

    @classmethod
    def free(cls, key: Hashable) -> "Event":
        return cls("free", key)

    @classmethod
    def free_requested(cls, key: Hashable) -> "Event":
        """A free while another stream still uses the block (record_stream): cached only at its completion."""
        return cls("free_requested", key)

    @classmethod
    def free_completed(cls, key: Hashable) -> "Event":
        return cls("free_completed", key)

    @classmethod
    def mark(cls, name: str) -> "Event":
        return cls("mark", name=name)

    @classmethod
    def grad(cls, name: str, key: Hashable) -> "Event":
        return cls("grad", key, name=name)

    @classmethod
    def reset_peak(cls) -> "Event":
        return cls("reset_peak")

    def is_block(self) -> bool:
        """An allocation or a free of a block (not a mark, a gradient or a reset)."""
        return self.kind in BLOCK_EVENTS

    def is_mark(self, name: str) -> bool:
        return self.kind == "mark" and self.name == name
