"""dataloader: what the loader Trainer iterates really used, and length-grouped batches that lose nothing."""

from memsweep.run.trainer import LengthBucketSampler


def test_fast_loader_uses_worker_processes_and_pinned_memory(tiny_job, tmp_path):
    default = tiny_job("max_steps=2", job_dir=tmp_path / "a")["effective"]["dataloader"]
    fast = tiny_job("max_steps=2", "dataloader=fast", job_dir=tmp_path / "b")["effective"]["dataloader"]
    assert (default["num_workers"], default["pin_memory"]) == (0, False)
    # Trainer drops pin_memory without a GPU (nothing to pin for): the audit shows what really ran.
    assert (fast["num_workers"], fast["pin_memory"], fast["persistent_workers"], fast["prefetch_factor"]) == \
        (2, False, True, 4)
    assert default["sampler"] == fast["sampler"] == "LengthBucketSampler"


def test_length_buckets_visit_every_example_once_with_less_padding():
    import random

    rng = random.Random(0)
    lengths = [rng.randint(5, 60) for _ in range(1000)]
    order = list(LengthBucketSampler(lengths, batch_size=32, seed=1))
    assert sorted(order) == list(range(1000))
    padded = lambda idx: sum(max(lengths[i] for i in idx[k:k + 32]) * len(idx[k:k + 32])  # noqa: E731
                             for k in range(0, len(idx), 32))
    assert padded(order) < 0.8 * padded(list(range(1000)))
    assert order != list(LengthBucketSampler(lengths, batch_size=32, seed=2))  # shuffled by seed
