"""Per-step wall times and start-up in results.json, and token counting without a per-step host read."""
import traceback

import torch

from conftest import TINY, build_job
from memsweep.measure.steptime import step_summary


def test_step_summary_leaves_out_warmup_and_skipped_steps():
    ends = [10.0, 11.0, 13.0, 13.5, 14.0, 14.5]  # steps 1..6 end here: steps 2..6 last 1, 2, .5, .5, .5
    assert step_summary(ends, skip=set(), warmup=1) == {"step_s_median": 0.5, "steps_timed": 5}
    assert step_summary(ends, skip={2}, warmup=1) == {"step_s_median": 0.5, "steps_timed": 4}
    assert step_summary(ends[:3], skip={3}, warmup=1) == {"step_s_median": 1.0, "steps_timed": 1}
    assert step_summary(ends[:1], skip=set()) == {"step_s_median": None, "steps_timed": 0}


def test_job_records_step_times_and_startup(tiny_job):
    t = tiny_job("max_steps=5")["time"]
    assert t["steps_timed"] == 3  # steps 3, 4, 5: step 1 is warm-up, step 2 the padded ledger step
    assert 0 < t["step_s_median"] < t["train_s"]
    assert 0 < t["setup_s"] < t["startup_s"]  # the process started before the job did


def test_tokens_seen_are_every_non_padding_token_of_an_epoch(tiny_job, tmp_path):
    built = build_job(TINY, tmp_path / "built")
    expected = sum(len(x) for x in built.data.train["input_ids"])
    res = tiny_job("epochs=1", job_dir=tmp_path / "run")
    # the ledger step is padded to max_seq_len: padding must not count
    assert res["data"]["train_tokens_seen"] == expected


def test_training_reads_no_tensor_back_every_step(tmp_path, monkeypatch):
    built = build_job(TINY + ["max_steps=20"], tmp_path / "job")
    reads = []
    item = torch.Tensor.item

    def spy(self):
        # torch's for-loop AdamW reads its step counter, a host-side scalar by design: not a device read
        if not any("torch/optim/" in f.filename for f in traceback.extract_stack(limit=8)):
            reads.append(1)
        return item(self)

    monkeypatch.setattr(torch.Tensor, "item", spy)
    built.trainer.train()
    # Trainer logs every 10 steps (loss, grad norm, tokens): a few reads, not one per step
    assert 0 < len(reads) < 20
    assert built.trainer.tokens_seen() > 0


GLOBAL_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                "_global_backward_hooks")


def hooks_left(model) -> dict:
    """What a memory tracker left behind: global module hooks, dispatch modes, hooks on `model`."""
    from torch.nn.modules import module as nn_module
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    left = {name: len(getattr(nn_module, name)) for name in GLOBAL_HOOKS if getattr(nn_module, name)}
    if modes := _get_current_dispatch_mode_stack():
        left["dispatch modes"] = modes
    left.update({name: "module hooks" for name, m in model.named_modules()
                 if m._forward_pre_hooks or m._forward_hooks or m._backward_hooks or m._backward_pre_hooks})
    left.update({name: [getattr(h, "__qualname__", repr(h)) for h in p._post_accumulate_grad_hooks.values()]
                 for name, p in model.named_parameters() if getattr(p, "_post_accumulate_grad_hooks", None)})
    return left


def test_ledger_step_leaves_no_hook_behind(tmp_path):
    # MemTracker hooks every module and parameter for the ledger step; any hook left installed would
    # run on every later step (the cost `make bench` counts in its "what memsweep adds" section).
    built = build_job(TINY + ["max_steps=4"], tmp_path / "job")
    built.trainer.train()
    assert built.ledger.ledger.peak_bytes > 0  # the ledger did track step 2
    assert hooks_left(built.trainer.model) == {}


def test_a_job_that_dies_in_the_ledger_step_leaves_the_process_clean(tiny_job, tmp_path, monkeypatch):
    # An OOM inside the tracked step skips its on_step_end: the next job of a sweep must not run tracked.
    # The allocation fails inside the tracked step's first forward, whatever memory this process holds.
    from memsweep.measure import ledger

    def out_of_memory(self, module, inputs, output):
        raise MemoryError("the tracked step's allocation failed")

    with monkeypatch.context() as patched:
        patched.setattr(ledger.LedgerCallback, "_see_compute", out_of_memory)
        oom = tiny_job("max_steps=3")
    assert oom["status"] == "oom", oom["reason"]
    built = build_job(TINY + ["max_steps=3"], tmp_path / "next")
    built.trainer.train()
    assert hooks_left(built.trainer.model) == {}


def test_a_step_is_predicted_at_the_datas_typical_padded_length():
    import random
    import statistics

    from memsweep.run.lengths import typical_padded_length

    rng = random.Random(0)
    lengths = [rng.randint(5, 60) for _ in range(2000)]
    # one example per step, in any order: the median example, as padded
    assert typical_padded_length(lengths, 1, 1, None, False, 0) == round(statistics.median(lengths))
    assert typical_padded_length(lengths, 1, 1, 64, False, 0) == 64
    # a random batch of 32 is padded to nearly the longest; grouped by length (the job's sampler), far less
    grouped, shuffled = (typical_padded_length(lengths, 32, 1, None, g, 0) for g in (True, False))
    assert grouped < 0.7 * shuffled and shuffled >= statistics.quantiles(lengths, n=20)[-1]
    # accumulated micro-batches of one: a step takes their mean
    assert abs(typical_padded_length(lengths, 1, 32, None, False, 0) - statistics.mean(lengths)) < 3


def test_a_grouped_jobs_typical_length_is_read_off_the_batches_its_own_sampler_makes():
    import random
    import statistics

    from memsweep.run.lengths import typical_padded_length
    from memsweep.run.trainer import LengthBucketSampler

    rng = random.Random(1)
    lengths = [rng.randint(5, 64) for _ in range(320)]
    order = list(LengthBucketSampler(lengths, batch_size=32, seed=42))
    padded = [max(lengths[i] for i in order[s:s + 32]) for s in range(0, 320, 32)]
    # steps 3-10, as the step timer times them (its warm-up step and the ledger's left out)
    assert typical_padded_length(lengths, 32, 1, None, True, 42, steps=10, left_out=frozenset({1, 2})) == round(
        statistics.median(padded[2:]))


def test_a_job_of_short_examples_predicts_its_step_at_their_length_beside_the_longest(tiny_job):
    res = tiny_job("max_steps=5", "max_seq_len=128")
    at_data, est = res["estimate"]["at_data"], res["estimate"]
    assert at_data["seq_len"] < 128 and 0 < at_data["step_s"] < est["predicted_step_s"]
    from memsweep.run import results
    assert results.estimate_vs_measured(res)["predicted_step_s"] == at_data["step_s"]
