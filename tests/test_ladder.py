"""experiment=ladder: each row adds a technique; the measured peak never rises, and ends near the weights alone."""
import pytest

from conftest import ROOT, run_job

pytestmark = pytest.mark.slow  # seven MiniLM jobs

ROWS = sorted(p.stem for p in (ROOT / "conf" / "ladder").glob("*.yaml"))


def accumulates(row: str) -> bool:
    return "override /accumulation" in (ROOT / "conf" / "ladder" / f"{row}.yaml").read_text()


def test_ladder_peaks_fall_row_by_row(tmp_path):
    # MiniLM (on the tiny model every row peaks in AdamW's embedding update, so the ladder is flat).
    # To fit CI, one optimizer step is measured (no warm-up) of 8 sequences of 32, in fp32: a CPU without
    # native fp16 emulates it ~100x slower (the fp16 row then equals the baseline; fp16's own saving is
    # tested in test_precision). The rows that accumulate keep micro-batch 1 (8 steps of 1 instead of 32:
    # the same peak, a quarter of the time). The full ladder is a sweep (README).
    peaks, weight_bytes = {}, {}
    for row in ROWS:
        micro_batch_1 = ["accumulation.steps=8"] if accumulates(row) else []
        res = run_job(["experiment=ladder", f"ladder={row}", "max_steps=1", "measure.warmup_steps=0", "batch_size=8",
                       "max_seq_len=32", "precision=fp32", "data.train_size=16", "data.eval_size=8", "logger=none",
                       "measure.estimate=false", *micro_batch_1],
                      tmp_path / row)
        assert res["status"] == "ok", (row, res["reason"])
        assert res["effective"]["micro_batch_size"] == (1 if micro_batch_1 else 8), row
        peaks[row] = res["memory"]["peak_bytes"]
        weight_bytes[row] = res["memory"]["params_bytes"]
    ladder = [peaks[r] for r in ROWS if r != "6_lora"]
    # fp16 adds the loss scaler's own state (a scale and a growth counter: 12 bytes); at one step of
    # length 32 the peak is AdamW's step in rows 0-3, so that is all that changes there.
    scaler_bytes = 16
    assert all(later <= earlier + scaler_bytes for earlier, later in zip(ladder, ladder[1:])), peaks
    # At one step of length 32 the baseline peaks in AdamW's step: weights, gradients and two moments,
    # four copies of the weights; with the encoder frozen little more than the weights is left. (At
    # the full ladder's settings, step 2 at length 64, the baseline holds activations besides.)
    weights = weight_bytes["0_baseline"]
    assert ladder[0] >= 4 * weights and ladder[-1] <= 1.05 * weights, (peaks, weights)
    assert peaks["6_lora"] < peaks["0_baseline"] / 2
