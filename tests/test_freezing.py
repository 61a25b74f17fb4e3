"""freezing: what is trainable, what the gradients weigh, and the frozen-encoder + checkpointing trap."""
import pytest

from conftest import TINY, build_job


@pytest.mark.fast
@pytest.mark.parametrize("option, trainable", [
    ("none", lambda n: True),
    ("embeddings", lambda n: ".embeddings." not in n),
    ("encoder", lambda n: n.startswith("classifier.")),
    ("bottom_half", lambda n: ".embeddings." not in n and ".layer.0." not in n),  # tiny has 2 layers
])
def test_freezing_leaves_exactly_the_expected_parameters_trainable(tmp_path, option, trainable):
    model = build_job(TINY + [f"freezing={option}"], tmp_path).trainer.model
    got = {n for n, p in model.named_parameters() if p.requires_grad}
    assert got == {n for n, _ in model.named_parameters() if trainable(n)}


def test_frozen_encoder_trains_only_the_head_and_gradient_bytes_match(tiny_job):
    res = tiny_job("freezing=encoder", "max_steps=2")
    eff = res["effective"]
    assert eff["trainable_params"] == 64 * 2 + 2  # the classifier of the tiny model
    assert eff["frozen_params"] == eff["total_params"] - eff["trainable_params"]
    assert res["memory"]["grads_bytes"] == 4 * eff["trainable_params"]
    assert res["memory"]["optimizer_bytes"] < 2 * 4 * eff["trainable_params"] + 64


def test_checkpointing_does_not_backpropagate_through_a_frozen_encoder(tmp_path):
    # transformers makes the embedding output require grad when checkpointing is enabled; with a frozen
    # encoder that makes backward recompute and traverse every frozen layer (3x slower for nothing).
    built = build_job(TINY + ["freezing=encoder", "checkpointing=full", "max_steps=1", "measure.ledger=false"],
                      tmp_path)
    layer = built.trainer.model.bert.encoder.layer[0]
    calls = []
    layer.register_forward_hook(lambda *a: calls.append(1))
    built.trainer.train()
    assert len(calls) == 1  # forward once, never recomputed in backward
