"""experiment=ladder: each row adds a technique; the measured peak never rises, and ends below a fifth."""
from conftest import ROOT, run_job

ROWS = sorted(p.stem for p in (ROOT / "conf" / "ladder").glob("*.yaml"))


def test_ladder_peaks_fall_row_by_row(tmp_path):
    # The ledger is taken on optimizer step 2, so two steps measure what the full ladder run measures.
    peaks = {}
    for row in ROWS:
        res = run_job(["experiment=ladder", f"ladder={row}", "max_steps=2", "data.train_size=128",
                       "data.eval_size=32", "logger=none"], tmp_path / row)
        assert res["status"] == "ok", (row, res["reason"])
        peaks[row] = res["memory"]["peak_bytes"]
    ladder = [peaks[r] for r in ROWS if r != "6_lora"]
    assert all(later <= earlier for earlier, later in zip(ladder, ladder[1:])), peaks
    assert ladder[-1] <= ladder[0] / 5, peaks
    assert peaks["6_lora"] < peaks["0_baseline"] / 2
