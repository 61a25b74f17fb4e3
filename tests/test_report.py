"""The sweep summary on sweep dirs laid out as Hydra lays them out, with results.json of known values.

(Real sweeps build real summaries in test_sweep.py; here the numbers are chosen so every Δ, speed-up
and missing row can be checked exactly.)
"""
import json
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.image import imread
from omegaconf import OmegaConf

from memsweep.app.callbacks import SweepReport
from memsweep.run import results
from memsweep.sweep import report
from memsweep.sweep import sweepdir as sweep_mod
from wandb_records import wait_for_run

GIB = 2**30
GRID = ["precision=fp32,bf16", "optim=adamw,sgd,adafactor", "model=tiny"]


def ok_results(overrides, peak_gib, train_s, f1, predicted_gib=None):
    res = results.Result.start(overrides, "0123456789abcdef").to_dict()
    if predicted_gib is not None:  # what job.py stores before training (measure.estimate): 10 % slower steps
        res["estimate"] = {"method": "trace", "peak_bytes": int(predicted_gib * GIB), "predicted_step_s": train_s / 90}
    peak = int(peak_gib * GIB)
    # the breakdown at the peak sums to the peak: params 1/4, grads 1/4, optimizer 1/4, rest split
    quarter = peak // 4
    breakdown = {"params": quarter, "buffers": 0, "grads": quarter, "activations": quarter // 2,
                 "temp": quarter // 2, "optimizer": quarter, "other": 0}
    breakdown["other"] = peak - sum(breakdown.values())
    res.update(status="ok", reason=None)
    res["metrics"].update(f1=f1, accuracy=0.9, train_loss=0.3, eval_loss=0.4)
    res["time"].update(train_s=train_s, total_s=train_s + 5, samples_per_s=1000 / train_s, tokens_per_s=9.0,
                       step_s_median=train_s / 100)
    res["memory"].update(peak_bytes=peak, params_bytes=quarter, grads_bytes=quarter, optimizer_bytes=quarter,
                         activations_bytes=quarter, peak_breakdown=breakdown, device="cpu")
    res["data"] = {"train_examples": 1000, "labels": ["negative", "positive"]}
    return res


def make_sweep(root: Path, outcomes: dict, baseline=None, grid=tuple(GRID)) -> Path:
    """A sweep dir: multirun.yaml with GRID, and per job number: .hydra/hydra.yaml (as Hydra writes it
    when the job starts) and, unless the outcome is None (killed), its results.json."""
    root.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create({
        "hydra": {"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                              "max_batch_size": None, "params": None},
                  "overrides": {"hydra": [f"hydra.sweep.dir={root}"], "task": list(grid)}},
        "report": {"baseline": baseline}, "logger": {"name": "none"}}), root / "multirun.yaml")
    jobs = sweep_mod.grid(root)
    for num, outcome in outcomes.items():
        job_dir = root / str(num)
        (job_dir / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create({"hydra": {"job": {"num": num}, "overrides": {"task": jobs[num]}}}),
                       job_dir / ".hydra" / "hydra.yaml")
        if outcome is None:
            continue
        if isinstance(outcome[0], str):  # (status, reason)
            res = results.Result.start(jobs[num], "0123456789abcdef").to_dict()
            res["status"], res["reason"] = outcome
        else:  # (peak GiB, train s, F1[, predicted GiB])
            res = ok_results(jobs[num], *outcome)
        results.write(job_dir / "results.json", res)
    return root


@pytest.fixture
def sweep(tmp_path):
    # 6 jobs in the grid; 0-2 ok, 3 oom, 4 killed mid-job (dir, no results), 5 never started
    return make_sweep(tmp_path / "sweep", {
        0: (1.0, 100.0, 0.85, 1.05),  # precision=fp32 optim=adamw: the baseline; predicted 5 % high
        1: (0.75, 50.0, 0.84),  # fp32 sgd: -25 %, 2x
        2: (0.5, 200.0, 0.86),  # fp32 adafactor: -50 %, 0.5x
        3: ("oom", "RuntimeError: DefaultCPUAllocator: can't allocate memory"),
        4: None,
    })


def test_the_grid_is_expanded_as_hydra_numbers_the_jobs(sweep):
    assert sweep_mod.grid(sweep) == [
        [f"precision={p}", f"optim={o}", "model=tiny"] for p in ("fp32", "bf16") for o in ("adamw", "sgd", "adafactor")]


def test_a_glob_sweep_is_expanded_from_the_sweeps_config_dir(tmp_path):
    (tmp_path / "conf" / "row").mkdir(parents=True)
    for name in ("b_second", "a_first"):
        (tmp_path / "conf" / "row" / f"{name}.yaml").write_text("# @package _global_\n")
    OmegaConf.save(OmegaConf.create({"hydra": {
        "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "params": None},
        "overrides": {"task": ["+row=glob(*)", "seed=1,2"]},
        "runtime": {"config_sources": [{"path": str(tmp_path / "conf"), "schema": "file", "provider": "main"}]},
    }}), tmp_path / "multirun.yaml")
    assert sweep_mod.grid(tmp_path) == [["+row=a_first", "seed=1"], ["+row=a_first", "seed=2"],
                                          ["+row=b_second", "seed=1"], ["+row=b_second", "seed=2"]]


@pytest.mark.fast
def test_every_job_has_a_row_with_its_status_and_reason_none_dropped(sweep):
    summary = report.build(sweep)
    report.write(summary)
    assert [(j.num, j.status) for j in summary.jobs] == [
        (0, "ok"), (1, "ok"), (2, "ok"), (3, "oom"), (4, "missing"), (5, "not started")]
    md = (sweep / "summary.md").read_text()
    assert "6 jobs (3 ok, 1 oom, 1 not started, 1 missing)" in md
    assert "job 3 (`precision=bf16 optim=adamw model=tiny`): **oom** — RuntimeError: DefaultCPUAllocator" in md
    assert ("job 4 (`precision=bf16 optim=sgd model=tiny`): **missing** — no complete results.json: the job was "
            "interrupted") in md
    assert "job 5 (`precision=bf16 optim=adafactor model=tiny`): **not started** — the job never started" in md
    assert "Common to every job: `model=tiny`" in md
    csv = pd.read_csv(sweep / "summary.csv")
    assert list(csv["job"]) == [0, 1, 2, 3, 4, 5]
    assert list(csv["status"]) == ["ok", "ok", "ok", "oom", "missing", "not started"]
    assert summary.failed == [summary.jobs[4]]  # oom is a result, a lost job is not
    assert summary.unfinished == [summary.jobs[5]]  # resume runs it


@pytest.mark.fast
def test_the_human_table_compares_each_job_with_the_baseline(sweep):
    table = report.build(sweep).markdown.split("\n")
    header = next(line for line in table if line.startswith("| #"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "#", "precision", "optim", "status", "peak GiB", "params", "grads", "optimizer", "activations", "other",
        "predicted GiB", "error", "Δ memory", "speed-up", "train s", "samples/s", "ms/step", "predicted ms/step",
        "time error", "F1"]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in table if line.startswith("| ") and line.split("|")[1].strip().isdigit()}
    assert rows["0"][3:] == ["ok", "1.000", "0.250", "0.250", "0.250", "0.125", "0.125", "1.050", "+5.0 %",
                             "baseline", "1.00×", "100.0", "10.0", "1000.0", "1111.1", "+11.1 %", "0.850"]
    assert rows["1"][10:14] == ["–", "–", "-25.0 %", "2.00×"]  # no estimate stored: nothing invented
    assert rows["1"][16:19] == ["500.0", "–", "–"]
    assert rows["2"][12:14] == ["-50.0 %", "0.50×"]
    assert rows["3"][3:] == ["oom"] + ["–"] * 16


def test_baseline_by_job_number_or_by_overrides(sweep):
    jobs = sweep_mod.collect(sweep)
    assert report.find_baseline(jobs, None).num == 0
    assert report.find_baseline(jobs, "2").num == 2
    assert report.find_baseline(jobs, "optim=sgd").num == 1
    assert report.find_baseline(jobs, '"precision=bf16,optim=sgd"').num == 4
    md = report.build(sweep, "optim=adafactor").markdown
    assert "Baseline: job 2" in md and "| +100.0 %" in md and "| 2.00×" in md  # job 0 against job 2
    with pytest.raises(report.ReportError, match="no job has these overrides; the jobs are: 0: precision=fp32"):
        report.find_baseline(jobs, "optim=lion")
    with pytest.raises(report.ReportError, match="there is no job 9"):
        report.find_baseline(jobs, "9")
    # at the end of a sweep a wrong baseline must not cost the summary: first job, and a note
    summary = report.build(sweep, "optim=lion", strict=False)
    assert summary.baseline.num == 0 and "using job 0 instead" in summary.markdown


def test_a_baseline_that_did_not_run_gives_no_comparison_and_says_why(sweep):
    md = report.build(sweep, "3").markdown
    assert "the baseline (job 3) is oom: no Δ memory or speed-up" in md
    assert "-25.0 %" not in md and "×" not in md


def test_csv_holds_every_results_field_flattened(sweep):
    report.write(report.build(sweep))
    csv = pd.read_csv(sweep / "summary.csv")
    expected = set(results.flatten(ok_results(["a=1"], 1.0, 1.0, 0.5)))
    assert expected - {"overrides"} <= set(csv.columns)
    for column in ("memory.peak_breakdown.activations", "time.train_s", "versions.torch", "config_hash",
                   "baseline.delta_memory_pct", "baseline.speedup", "job_dir"):
        assert column in csv.columns
    row1 = csv[csv.job == 1].iloc[0]
    assert row1["memory.peak_bytes"] == int(0.75 * GIB) and row1["baseline.speedup"] == pytest.approx(2.0)
    assert row1["overrides"] == "precision=fp32 optim=sgd model=tiny"
    assert json.loads(row1["data.labels"]) == ["negative", "positive"]


@pytest.mark.fast
def test_plots_are_png_files_that_grow_with_the_sweep(tmp_path, sweep):
    report.write(report.build(sweep))
    small = make_sweep(tmp_path / "small", {0: (1.0, 10.0, 0.8)}, grid=["model=tiny"])
    report.write(report.build(small))
    for name in ("memory.png", "tradeoff.png"):
        assert (sweep / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one bar per job: the figure is taller for 6 jobs than for 1
    assert imread(sweep / "memory.png").shape[0] > imread(small / "memory.png").shape[0]


@pytest.mark.fast
def test_cli_rebuilds_an_interrupted_sweep_and_refuses_bad_input_in_one_line(sweep, tmp_path, capsys):
    assert report.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "**not started** — the job never started" in out and (sweep / "summary.md").is_file()
    assert report.main([""]) == 2
    assert capsys.readouterr().err.startswith("memsweep report: error: no sweep dir given; usage: make report SWEEP=")
    assert report.main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip() == f"memsweep report: error: {tmp_path / 'nowhere'} is not a directory"
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / "empty")]) == 2
    assert "is not a sweep dir" in capsys.readouterr().err
    assert report.main([str(sweep), "--baseline", "optim=lion"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no job has these overrides" in err


def test_cli_uses_the_baseline_the_sweep_was_run_with(tmp_path):
    sweep = make_sweep(tmp_path, {0: (1.0, 10.0, 0.8), 1: (0.5, 10.0, 0.8)}, baseline="1")
    assert report.main([str(sweep)]) == 0
    assert "Baseline: job 1" in (sweep / "summary.md").read_text()


def config_for(sweep: Path, logger_enabled=False):
    return OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}, "report": {"baseline": None},
                             "logger": {"name": "wandb" if logger_enabled else "none"}})


def test_sweep_exit_code_is_1_only_when_a_job_failed_or_left_no_result(tmp_path, capsys):
    results_only = make_sweep(tmp_path / "a", {0: (1.0, 10.0, 0.8), 1: ("oom", "x"), 2: ("diverged", "NaN"),
                                               3: ("unsupported", "bf16"), 4: (0.5, 5.0, 0.7), 5: (0.5, 5.0, 0.7)})
    SweepReport().on_multirun_end(config_for(results_only))  # no exit: oom/diverged/unsupported are results
    assert "| 2.00×" in capsys.readouterr().out  # the table is printed
    with_error = make_sweep(tmp_path / "b", {0: (1.0, 10.0, 0.8), 1: ("failed", "ValueError: boom"),
                                             2: (1.0, 10.0, 0.8), 3: (1.0, 10.0, 0.8), 4: (1.0, 10.0, 0.8),
                                             5: (1.0, 10.0, 0.8)})
    with pytest.raises(SystemExit) as stop:
        SweepReport().on_multirun_end(config_for(with_error))
    assert stop.value.code == 1
    assert "1 job(s) failed or left no result: 1 (failed)" in capsys.readouterr().out
    assert (with_error / "summary.md").is_file()  # written before the exit


def test_a_stopped_sweep_exits_with_the_signals_code_after_its_summary(tmp_path, capsys):
    import os
    import signal

    from memsweep.run import stopping

    stopped = make_sweep(tmp_path / "a", {0: (1.0, 10.0, 0.8), 1: ("interrupted", "SIGTERM at optimizer step 3")})
    with pytest.raises(SystemExit) as stop:  # interrupted and not started jobs, no signal here: incomplete
        SweepReport().on_multirun_end(config_for(stopped))
    assert stop.value.code == 1
    assert "5 job(s) stopped or not started: 1 (interrupted), 2 (not started)" in capsys.readouterr().out
    stopping.install()
    os.kill(os.getpid(), signal.SIGTERM)  # this process was told to stop: the sweep says so
    with pytest.raises(SystemExit) as stop:
        SweepReport().on_multirun_end(config_for(stopped))
    assert stop.value.code == 143 and stopping.requested() is None  # the handlers are gone with the sweep
    out = capsys.readouterr().out
    assert f"sweep stopped by SIGTERM; resume it with: python -m memsweep.resume {stopped}" in out
    assert "1 ok, 1 interrupted, 4 not started" in (stopped / "summary.md").read_text()


@pytest.mark.fast
def test_wandb_summary_run_holds_the_table_and_both_plots(sweep):
    from memsweep.config.schema import LoggerConf

    summary = report.build(sweep)
    report.write(summary)
    run_dir = report.log_to_wandb(summary, LoggerConf(), group="my_sweep")
    run = wait_for_run(next(run_dir.glob("run-*.wandb")))  # this run's own file, not the newest by name
    assert run_dir.parent == sweep / "wandb"
    assert run["run"].job_type == "summary" and run["run"].run_group == "my_sweep"
    assert run["summary"]["jobs.ok"] == 3 and run["summary"]["jobs.missing"] == 1
    assert run["summary"]["jobs.not_started"] == 1
    assert run["summary"]["memory/_type"] == "image-file" and run["summary"]["tradeoff/_type"] == "image-file"
    table = json.loads((run_dir / "files" / run["summary"]["summary/path"]).read_text())
    assert table["columns"][:4] == ["job", "precision", "optim", "status"]
    assert [row[3] for row in table["data"]] == ["ok", "ok", "ok", "oom", "missing", "not started"]
    assert table["data"][1][table["columns"].index("speedup")] == pytest.approx(2.0)


def test_the_failed_jobs_line_names_a_traceback_only_where_a_job_wrote_one(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep", {0: (1.0, 10.0, 0.8), 1: ("failed", "bad input: lr: -1 ... allowed: > 0"),
                                            2: ("failed", "ValueError: boom"), 3: ("unsupported", "bf16"), 4: None,
                                            5: (1.0, 10.0, 0.8)})
    (sweep / "2" / report.TRACEBACK_FILE).write_text("Traceback ...\nValueError: boom\n")  # as job.py writes it
    line = report.failed_line(report.build(sweep))
    assert line == (f"[memsweep] error: 3 job(s) failed or left no result: 1 (failed), 2 (failed), 4 (missing); "
                    f"reasons in {sweep / 'summary.md'}; traceback: {sweep / '2' / 'traceback.txt'}")
    refused_only = make_sweep(tmp_path / "refused", {0: (1.0, 10.0, 0.8), 1: ("failed", "bad input: lr: -1"),
                                                     **{n: (1.0, 10.0, 0.8) for n in range(2, 6)}})
    with pytest.raises(SystemExit):
        SweepReport().on_multirun_end(config_for(refused_only))
    out = capsys.readouterr().out
    assert "1 job(s) failed or left no result: 1 (failed); reasons in" in out and "traceback" not in out
    assert "**failed** — bad input: lr: -1" in (refused_only / "summary.md").read_text()  # where the reason is
    all_ok = make_sweep(tmp_path / "ok", {n: (1.0, 10.0, 0.8) for n in range(6)})
    assert report.failed_line(report.build(all_ok)) is None
