"""What the CUDA caching allocator model (allocator.py) is configured by: the constants at the top of
CUDACachingAllocator.cpp, and the PYTORCH_CUDA_ALLOC_CONF options that change what is reserved."""
from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20

# The constants at the top of CUDACachingAllocator.cpp (namespace Native; kLargeBuffer is also in
# c10/core/CachingDeviceAllocator.h in newer versions), with the comments they carry there:
K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: "all sizes are rounded to at least 512 bytes" (round_size)
K_SMALL_SIZE = 1 * MIB  # kSmallSize: "largest 'small' allocation is 1 MiB" (get_pool: <= goes small)
K_SMALL_BUFFER = 2 * MIB  # kSmallBuffer: "'small' allocations are packed in 2 MiB blocks"
K_MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: "allocations between 1 and 10 MiB may use kLargeBuffer"
K_LARGE_BUFFER = 20 * MIB  # kLargeBuffer: "'large' allocations may be packed in 20 MiB blocks"
K_ROUND_LARGE = 2 * MIB  # kRoundLarge: "round up large allocations to 2 MiB"


@dataclass(frozen=True)
class Options:
    """The PYTORCH_CUDA_ALLOC_CONF settings that change what is reserved (docs: "Optimizing memory
    usage with PYTORCH_CUDA_ALLOC_CONF")."""
    max_split_size: int | None = None  # bytes; None = unlimited, the default ("all blocks can be split")
    # max_non_split_rounding_mb: how much larger than a request an unsplittable block may be and still
    # serve it; "In the default case, we only allow up to 20MB of rounding of non-split blocks".
    max_non_split_rounding: int = K_LARGE_BUFFER
    expandable_segments: bool = False

    @classmethod
    def parse(cls, conf: str | None) -> Options:
        """From a PYTORCH_CUDA_ALLOC_CONF string ("<option>:<value>,..."); options not modelled are ignored."""
        values = dict(item.split(":", 1) for item in (conf or "").replace(" ", "").split(",") if ":" in item)
        options = cls(expandable_segments=values.get("expandable_segments", "False") == "True")
        if "max_split_size_mb" in values:
            mb = int(values["max_split_size_mb"])
            # AllocatorConfig::parseMaxSplitSize: "max_split_size_mb too small, must be >= 20" (kLargeBuffer;
            # "> 20" in 2.x versions before the config moved to c10/core)
            if mb < K_LARGE_BUFFER // MIB:
                raise ValueError(f"max_split_size_mb must be >= {K_LARGE_BUFFER // MIB}, got {mb}")
            options = cls(mb * MIB, options.max_non_split_rounding, options.expandable_segments)
        if "max_non_split_rounding_mb" in values:
            options = cls(options.max_split_size, int(values["max_non_split_rounding_mb"]) * MIB,
                          options.expandable_segments)
        return options
