"""task: classification (F1) and causal_lm (next-token loss, perplexity) on the same embedded tweets."""
import math

import pytest
import torch

from conftest import THREADS, run_job
from memsweep.run.trainer import pad_batch

# One worker runs the whole module (`make test`: --dist loadgroup), so its module fixture's jobs run once.
pytestmark = pytest.mark.xdist_group("task")

DECODER = ["task=causal_lm", "model=tiny-llama", "data.train_size=256", "data.eval_size=64", "logger=none",
           f"threads={THREADS}", "batch_size=16", "max_seq_len=32"]


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    return run_job(DECODER + ["lr=2e-3"], tmp_path_factory.mktemp("causal"))


def test_causal_lm_learns_the_next_token_and_reports_perplexity(causal):
    m = causal["metrics"]
    assert causal["status"] == "ok" and m["f1"] is None and m["accuracy"] is None
    assert m["perplexity"] == pytest.approx(math.exp(m["eval_loss"]))
    # a random model predicts uniformly: loss ln(vocabulary) = 10.33; 16 steps at lr 2e-3 learn the
    # tweets' frequent tokens (measured: 9.26)
    assert m["eval_loss"] < math.log(30522) - 0.5
    assert causal["effective"]["total_params"] > 0 and causal["data"]["labels"] == []


def test_the_measured_step_pads_labels_with_the_ignore_index():
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 3, dtype=torch.long),
             "labels": torch.ones(2, 3, dtype=torch.long)}
    padded = pad_batch(batch, 5, pad_token_id=0)
    assert padded["labels"][:, 3:].eq(-100).all() and padded["input_ids"][:, 3:].eq(0).all()
    assert padded["attention_mask"][:, 3:].eq(0).all()


def test_a_text_only_file_trains_a_causal_lm_but_not_a_classifier(tmp_path):
    import pandas as pd

    from memsweep.run.data import tweets_path

    texts = pd.read_csv(tweets_path(), encoding="latin-1")["text"].head(200)
    path = tmp_path / "texts.csv"
    pd.DataFrame({"text": texts}).to_csv(path, index=False)
    common = ["data=csv", f"data.path={path}", "data.train_size=64", "data.eval_size=32", "max_steps=2"]
    res = run_job(DECODER[:2] + DECODER[4:] + common, tmp_path / "lm")
    assert res["status"] == "ok" and res["data"]["train_examples"] == 64
    refused = run_job(["model=tiny", "logger=none", *common], tmp_path / "cls")
    assert refused["status"] == "failed" and refused["reason"].startswith("bad input: ")
    assert "data.label_column" in refused["reason"]
