"""plan.run (app/confirm.py, planner/command.py, planner/confirmed.py): the plan's best rows run as a Hydra
multirun of short real jobs, and what they measured written beside the plan; each fitting row's command."""
import dataclasses
import json

import pytest
from omegaconf import OmegaConf

from conftest import compose_config, job_of, run_job
from memsweep.app import confirm
from memsweep.errors import ConfigError
from memsweep.planner import command, confirmed, search, space
from memsweep.planner.depth import Figures
from memsweep.planner.space import Combination
from surfaces import assert_refused, refusal, train_py

SPACE = ["model=tiny", "plan.hardware=[cpu]", "plan.precision=[fp32]", "plan.optim=[adamw,sgd]",
         "plan.checkpointing=[none]", "plan.lora=[none]", "plan.offload=[none]", "plan.deepspeed=[none]",
         "plan.fsdp=[none]", "plan.micro_batches=[8,16]", "batch_size=16", "max_seq_len=32", "plan.depths=[]",
         "data.train_size=64", "data.eval_size=16", "logger=none", "plan.run_steps=3"]


def test_a_row_keeps_the_plan_jobs_own_overrides_and_sets_its_own():
    given = ["model=tiny", "mode=plan", "plan.run=2", "precision=bf16", "hardware.memory_gib=4", "lr=1e-3",
             "+data.pad_to_multiple_of=8", "accumulation=x4", "max_steps=100"]
    assert command.base_overrides(given) == ["model=tiny", "lr=1e-3"]


@pytest.mark.fast
def test_the_rows_config_group_composes_the_job_its_command_names(tmp_path):
    job, _ = job_of([*SPACE, "mode=plan"])
    row = search.PlanRow(Combination("bf16", "sgd", "full", "r8"), micro_batch=4, accumulation=4, gpu="cpu",
                         status="fits", rank=1)
    confirm.write_group([row], job, tmp_path)
    base = command.base_overrides([*SPACE, "mode=plan"])
    by_group = compose_config([*base, f"hydra.searchpath=[file://{tmp_path}]", "+plan_row=cpu_1"])
    by_command = compose_config([*base, *command.row_overrides(row, job, job.plan.run_steps)])
    assert OmegaConf.to_container(by_group) == OmegaConf.to_container(by_command)
    assert by_command.accumulation.steps == 4 and by_command.max_steps == 3 and by_command.lora.name == "r8"


def run(rank: int, step_s: float, measured_s: float, memory: int, measured_memory: int, status="ok"):
    figures = Figures(peak_bytes=memory, allocated_bytes=memory, reserved_bytes=memory, overhead_bytes=0,
                      step_s=step_s, why_not=None, time_note=None, tokens=1)
    row = search.PlanRow(Combination("fp32", "adamw", "none", "none"), 1, 1, "cpu", "fits", figures=figures,
                         rank=rank)
    return row, confirmed.Measured(status, "", measured_s if status == "ok" else None, measured_memory, None, "c")


@pytest.mark.fast
def test_the_agreement_ranks_the_measured_rows_and_counts_the_rows_predicted_under():
    rows, measured = zip(run(1, 1.0, 1.3, 100, 99), run(2, 2.0, 1.2, 100, 104), run(3, 3.0, 3.3, 100, 100),
                         run(4, 4.0, 0, 100, 0, status="oom"))
    runs = confirmed.ranked(list(rows), list(measured))
    assert [r.measured_rank for r in runs] == [2, 1, 3, None]  # the oom row has no rank
    a = confirmed.agreement(runs, "cpu")
    assert a.rows == 3 and a.spearman == pytest.approx(0.5)
    assert a.regret == pytest.approx(1.3 / 1.2 - 1)  # the first row against the fastest measured
    assert a.largest_time_error == pytest.approx(2.0 / 1.2 - 1) and a.memory_under == 1
    assert a.largest_memory_error == pytest.approx(100 / 104 - 1)


def test_plan_run_needs_a_profile_of_this_machine(tmp_path, capsys, no_work):
    assert_refused(refusal(lambda: train_py(["mode=plan", "plan.hardware=[t4]", "plan.run=1"], tmp_path), capsys),
                   "plan.run", "is this machine (cpu)")


def test_plan_hardware_auto_is_this_machines_profile(monkeypatch):
    job, _ = job_of(["model=tiny", "mode=plan", "plan.hardware=[auto,t4,cpu]", "plan.run=1"])
    assert space.profiles(job) == ["cpu", "t4"]  # auto read as the CPU here, named once
    space.check_plan_keys(job)  # plan.run has this machine's profile: no refusal
    monkeypatch.setattr(space, "this_machine", lambda: "a CUDA card without a profile")
    with pytest.raises(ConfigError, match="plan.hardware.*auto is this machine's a CUDA card without a profile"):
        space.profiles(job)


@pytest.mark.slow
def test_plan_run_confirms_the_best_rows_and_records_a_failed_one_while_the_others_go_on(tmp_path, monkeypatch):
    # the second row made one the command line refuses (an accumulation that does not divide the batch)
    def with_a_bad_row(rows, k):
        best = chosen(rows, k)
        return [best[0], dataclasses.replace(best[1], accumulation=3)]

    chosen = confirm.chosen
    monkeypatch.setattr(confirm, "chosen", with_a_bad_row)
    res = run_job([*SPACE, "mode=plan", "plan.run=2"], tmp_path / "plan")
    assert res["status"] == "ok", res["reason"]
    ran = res["effective"]["plan"]["run"]
    assert (ran["rows"], ran["ok"]) == (2, 1), ran
    assert ran["agreement"][0]["rows"] == 1  # the failed row has no step time to agree with
    jobs = [json.loads((tmp_path / "plan" / "runs" / n / "results.json").read_text()) for n in ("0", "1")]
    assert [j["status"] for j in jobs] == ["ok", "failed"]
    assert jobs[1]["reason"].startswith("bad input: batch_size") and jobs[0]["time"]["step_s_median"] > 0
    cells = (tmp_path / "plan" / "plan.csv").read_text().splitlines()
    assert cells[0].endswith("measured_rank,measured_step_s,measured_gib,measured_counter,run_status,command")
    assert [sum(f",{status},python train.py" in line for line in cells) for status in ("ok", "failed")] == [1, 1]
    text = (tmp_path / "plan" / "plan.md").read_text()
    assert "## Confirmed by running (plan.run)" in text and (tmp_path / "plan" / "plan_run.png").is_file()
    assert "cpu rank 1: `python train.py model=tiny" in text and "bad input: batch_size" in text
