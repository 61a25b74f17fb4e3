"""accumulation: same effective batch, a quarter of the micro-batch, the same gradients as one full batch."""
import pytest
import torch
from transformers import TrainerCallback

from conftest import TINY, build_job

EXACT = TINY + ["model.dropout=0", "optim.max_grad_norm=0", "max_steps=1", "measure.ledger=false"]


class FirstGradients(TrainerCallback):
    def __init__(self):
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.grads is None:
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _first_step_gradients(overrides, job_dir):
    built = build_job(EXACT + overrides, job_dir)
    capture = FirstGradients()
    built.trainer.add_callback(capture)
    built.trainer.train()
    return capture.grads, built.trainer


def test_x4_gives_the_gradients_of_one_full_batch(tmp_path):
    # Stock Trainer would not divide this model's loss by the accumulation steps (transformers#47688):
    # the accumulated gradients would come out 4x too large.
    full, _ = _first_step_gradients([], tmp_path / "full")
    accumulated, trainer = _first_step_gradients(["accumulation=x4"], tmp_path / "x4")
    assert trainer.args.gradient_accumulation_steps == 4 and trainer.args.per_device_train_batch_size == 8
    assert full.keys() == accumulated.keys()
    flat_full = torch.cat([g.flatten() for g in full.values()])
    flat_acc = torch.cat([accumulated[n].flatten() for n in full])
    assert (flat_full - flat_acc).norm() / flat_full.norm() < 1e-5
    # per tensor too; an absolute floor for tensors whose true gradient is ~0 (e.g. attention key biases)
    floor = 1e-6 * flat_full.norm()
    for name in full:
        assert (full[name] - accumulated[name]).norm() <= 1e-5 * full[name].norm() + floor, name


@pytest.mark.slow  # two full-epoch jobs at 128 tokens
def test_x4_quarters_the_micro_batch_and_the_activations_not_the_steps(tiny_job, tmp_path):
    short_epoch = ["max_seq_len=128", "data.train_size=96", "data.eval_size=32", "measure.estimate=false"]
    one = tiny_job(*short_epoch, job_dir=tmp_path / "one")
    four = tiny_job(*short_epoch, "accumulation=x4", job_dir=tmp_path / "four")
    assert (one["effective"]["micro_batch_size"], four["effective"]["micro_batch_size"]) == (32, 8)
    assert four["effective"]["accumulation_steps"] == 4
    assert one["time"]["optimizer_steps"] == four["time"]["optimizer_steps"] == 3  # 96 examples / 32
    ratio = four["memory"]["activations_bytes"] / one["memory"]["activations_bytes"]
    assert 0.2 < ratio < 0.32, ratio
