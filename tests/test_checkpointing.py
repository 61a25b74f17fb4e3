"""checkpointing: measured activation bytes fall; layers really are checkpointed."""
import pytest


@pytest.mark.slow  # two MiniLM jobs at 128 tokens
def test_full_checkpointing_cuts_activation_bytes_five_fold(tmp_path):
    from conftest import THREADS, run_job

    # one optimizer step, measured without a warm-up (the bytes saved for backward are the same in every
    # step), and no estimate stored beside it: what is compared is measured
    common = ["model=minilm", "data.train_size=96", "data.eval_size=32", "logger=none", f"threads={THREADS}",
              "max_steps=1", "measure.warmup_steps=0", "measure.estimate=false", "max_seq_len=128"]
    plain = run_job(common, tmp_path / "plain")
    checkpointed = run_job(common + ["checkpointing=full"], tmp_path / "ckpt")
    assert checkpointed["effective"]["checkpointed_layers"] == 6 and plain["effective"]["checkpointed_layers"] == 0
    ratio = plain["memory"]["activations_bytes"] / checkpointed["memory"]["activations_bytes"]
    assert ratio >= 5, ratio
    assert checkpointed["memory"]["peak_bytes"] < plain["memory"]["peak_bytes"]


def test_selective_checkpointing_keeps_activations_between_none_and_full(tmp_path):
    # the tiny BERT at 64 tokens: selective keeps every other matmul's output and attention's, full only
    # each block's input
    from conftest import TINY, run_job

    held = {}
    for option in ("none", "selective", "full"):
        res = run_job(TINY + ["max_steps=2", "max_seq_len=64", f"checkpointing={option}"], tmp_path / option)
        assert res["status"] == "ok", res["reason"]
        held[option] = res["memory"]["activations_bytes"]
    assert held["full"] < held["selective"] < held["none"], held
