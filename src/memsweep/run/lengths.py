"""The order a job's sampler reads its examples in, and the lengths its micro-batches are padded to: what
trainer.LengthBucketSampler iterates, the estimate's typical step (estimate/core.typical_step) and the run
replay's steps (estimate/run_replay.py) are read from."""


def length_bucketed_order(lengths: list[int], batch_size: int, seed: int, bucket: int = 50) -> list[int]:
    """The order a length-grouped job reads its examples in (trainer.LengthBucketSampler, one epoch): shuffled, cut
    into chunks of `bucket` batches, each chunk sorted by length (the longest first) and cut into batches, the
    batches shuffled. Every example once; a batch holds examples of similar length."""
    import torch

    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(lengths), generator=g).tolist()
    chunk, batches = batch_size * bucket, []
    for start in range(0, len(order), chunk):
        part = sorted(order[start:start + chunk], key=lambda i: lengths[i], reverse=True)
        batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    return [i for b in torch.randperm(len(batches), generator=g).tolist() for i in batches[b]]


def padded_micro_batches(lengths: list[int], micro_batch: int, accumulation: int, multiple: int | None,
                         grouped: bool, seed: int) -> list[int]:
    """The micro-batches of one epoch in the order the job's sampler reads its examples (length_bucketed_order
    where `grouped`, grouping by the optimizer step's examples; else a random order), each the length of its
    longest example, rounded up to `multiple`."""
    import torch

    order = (length_bucketed_order(lengths, micro_batch * accumulation, seed) if grouped
             else torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed)).tolist())
    longest = (max(lengths[i] for i in order[start:start + micro_batch]) for start in range(0, len(order), micro_batch))
    return [-(-n // multiple) * multiple if multiple else n for n in longest]


def typical_padded_length(lengths: list[int], micro_batch: int, accumulation: int, multiple: int | None,
                          grouped: bool, seed: int, steps: int | None = None,
                          left_out: frozenset = frozenset()) -> int:
    """The length an optimizer step's micro-batches are padded to, typically: over an epoch batched as the
    job's sampler batches it (length_bucketed_order where `grouped`, as the job's Trainer reads its examples;
    else a random order), each micro-batch padded to its longest example (rounded up to `multiple`), the median
    over the optimizer steps (the first `steps`, less the 1-based ones `left_out`, as the step timer leaves out
    its warm-up and the ledger's step) of their micro-batches' mean length."""
    import statistics

    padded = padded_micro_batches(lengths, micro_batch, accumulation, multiple, grouped, seed)
    per_step = [statistics.mean(padded[i:i + accumulation]) for i in range(0, len(padded), accumulation)][:steps]
    timed = [length for n, length in enumerate(per_step, 1) if n not in left_out] or per_step
    return round(statistics.median(timed))
