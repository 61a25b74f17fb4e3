"""make validate-estimates: published rows become jobs (or say why they cannot), each prediction is
read on the source's own counter, and the errors are computed against the published figure."""
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import validate_estimates as ve  # noqa: E402

PUBLISHED = ROOT / "benchmarks" / "published"


def test_every_published_table_has_a_counter_and_rows_with_units():
    import yaml

    for path in sorted(PUBLISHED.glob("*.yaml")):
        table = yaml.safe_load(path.read_text())
        assert table["source"]["url"] and table["counter"], path.name
        for row in table["rows"]:
            assert row.get("memory") is None or ve.unit(row) in ve.UNIT_BYTES, (path.name, row["label"])


def test_rows_become_jobs_or_say_why_not():
    ladder = {"precision": "bf16_mixed (Fabric bf16-mixed)", "float32_matmul_precision": "highest"}
    assert "precision=bf16" in ve.job_for("rasbt_distilbert_imdb_precision", ladder, {})
    tf32 = {"precision": "fp32", "float32_matmul_precision": "high"}
    assert "precision=tf32" in ve.job_for("rasbt_distilbert_imdb_precision", tf32, {})
    with pytest.raises(ve.NotModelled, match="fp16_true"):
        ve.job_for("rasbt_distilbert_imdb_precision", {"precision": "fp16_true (Fabric 16-true)"}, {})
    with pytest.raises(ve.NotModelled, match="decoder"):
        ve.job_for("torchtune_llama32_3b_optimization_ladder", {}, {})
    assert ve.published_bytes({"memory": 5.37, "unit": "GB"}) == 5.37e9
    assert ve.published_bytes({"memory": None, "unit": "GB"}) is None


@pytest.mark.slow
def test_the_bert_large_row_is_predicted_on_its_counter(capsys):
    frame = ve.check([PUBLISHED / "mscherrmann_bert_large_rtx3090.yaml"])
    row = frame.iloc[0]
    assert row["counter"] == "max_memory_allocated" and row["note"] == "trace on rtx3090"
    assert row["published GiB"] == pytest.approx(10562.79 / 1024)
    expected = 100 * (row["predicted GiB"] - row["published GiB"]) / row["published GiB"]
    assert row["error %"] == pytest.approx(expected) and abs(row["error %"]) <= ve.TOLERANCE_PCT
