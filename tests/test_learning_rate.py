"""A learning rate that suits each row: the presets' rows that change what trains carry their own lr and its
source; a job records the lr it ran with (observed on its optimizer) and where it came from; the summary says
when its jobs used different learning rates."""
import pytest
from omegaconf import OmegaConf

from conftest import ROOT, THREADS, compose_config, run_job
from memsweep.run import results
from memsweep.sweep import report
from test_report import make_sweep

# Rows whose technique changes what trains (adapters, a frozen encoder, the optimizer's state or rule).
PRESETS = {"ladder": ["4_adafactor", "5_frozen_encoder", "6_lora"],
           "llm_demo": ["1_full_adamw_8bit", "2_lora_adamw", "3_lora_adamw_8bit", "4_qlora_adamw",
                        "5_qlora_adamw_8bit"]}
# A row's lr is what is tested: its accumulation x32 and checkpointing are left out (32 micro-batches of 1 take long).
TINY_ROW = ["model=tiny", "precision=fp32", "accumulation=none", "checkpointing=none", "max_steps=1",
            "measure.ledger=false", "max_seq_len=32", "data.train_size=64", "data.eval_size=32", "logger=none",
            "progress=none", "measure.estimate=false", f"threads={THREADS}"]


@pytest.mark.parametrize("experiment, row", [(e, r) for e, rows in PRESETS.items() for r in rows])
def test_every_row_that_changes_what_trains_states_where_its_lr_comes_from(experiment, row):
    cfg = compose_config([f"experiment={experiment}", f"{experiment}={row}"])
    source = cfg.tags.get("lr_source")
    assert source and source != compose_config([f"experiment={experiment}"]).tags.get("lr_source"), source


def test_a_row_trains_at_its_own_lr_and_results_record_it_with_its_source(tmp_path):
    res = run_job(["experiment=ladder", "ladder=6_lora", *TINY_ROW], tmp_path / "lora")
    row = OmegaConf.load(ROOT / "conf" / "ladder" / "6_lora.yaml")
    experiment = OmegaConf.load(ROOT / "conf" / "experiment" / "ladder.yaml")
    assert res["status"] == "ok", res["reason"]
    assert row.lr != experiment.lr  # the row's own, not the ladder's
    assert res["effective"]["learning_rate"] == pytest.approx(row.lr)  # what the optimizer was given
    assert res["lr_source"] == row.tags.lr_source


def test_an_lr_override_beats_the_row_and_says_so(tmp_path):
    res = run_job(["experiment=ladder", "ladder=6_lora", "lr=3e-4", *TINY_ROW], tmp_path / "override")
    assert res["effective"]["learning_rate"] == pytest.approx(3e-4)
    assert res["lr_source"] == "lr=3e-4 (override)"


def test_without_a_preset_the_lr_is_the_optimizers_own(tmp_path):
    res = run_job(["optim=sgd", *TINY_ROW], tmp_path / "sgd")
    assert res["effective"]["learning_rate"] == pytest.approx(5e-2)
    assert res["lr_source"] == "optim=sgd's own default (conf/optim/sgd.yaml)"
    assert res["metrics"]["perplexity_before"] is None and res["time"]["eval_before_s"] is None  # a classifier


def _with_lr(path, lr, source):
    res = results.read(path)
    res["effective"]["learning_rate"], res["lr_source"] = lr, source
    results.write(path, res)


def test_the_summary_shows_the_lr_only_when_jobs_differ_and_names_each_source(tmp_path):
    sweep = make_sweep(tmp_path / "same", {0: (1.0, 100.0, 0.85), 1: (0.75, 50.0, 0.84), 2: (0.5, 200.0, 0.86)})
    for num in range(3):
        _with_lr(sweep / str(num) / "results.json", 1e-4, "the optimizer's")
    assert "| lr" not in report.build(sweep).markdown and "different learning rates" not in report.build(sweep).markdown

    for num, lr, source in ((1, 1e-3, "a short search"), (2, 1e-3, "a short search")):
        _with_lr(sweep / str(num) / "results.json", lr, source)
    md = report.build(sweep).markdown
    assert "| lr" in md
    assert ("the jobs used different learning rates (column lr), each from its stated source: "
            "0.0001 (jobs 0): the optimizer's; 0.001 (jobs 1, 2): a short search") in md
