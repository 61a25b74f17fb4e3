"""Tensor-core shapes: GPU profiles flag a micro-batch, sequence length or vocabulary that is not a
multiple of their rule, in results.json, the job summary, mode=estimate and the sweep tables;
data.pad_to_multiple_of pads the batches."""
import json

import pytest

from conftest import TINY, build_job, run_job
from memsweep.app.job import print_summary
from memsweep.config.schema import HardwareConf
from memsweep.measure import shapes
from memsweep.run import results
from memsweep.run.train_loop import release
from memsweep.sweep import report
from memsweep.sweep.estimates import sweep_table
from memsweep.sweep.sweepdir import SweepJob
from test_report import make_sweep, ok_results

T4 = HardwareConf(name="t4", device="cuda", tensor_core_multiple=8)
A100 = HardwareConf(name="a100_40gb", device="cuda", tensor_core_multiple=64)
CPU = HardwareConf(name="cpu", device="cpu")


def test_flags_each_shape_that_is_not_a_multiple():
    assert list(shapes.flags(8, micro_batch=12, vocab_size=30522, pad_to_multiple_of=None)) == [
        "micro-batch", "sequence length", "vocabulary"]
    assert shapes.flags(8, micro_batch=16, vocab_size=30528, pad_to_multiple_of=8) == {}
    assert shapes.flags(8, micro_batch=64, vocab_size=30528, pad_to_multiple_of=64) == {}
    # an A100's rule is 64: padding to 8 and a micro-batch of 32 are not enough (30528 = 477 x 64 is)
    assert list(shapes.flags(64, micro_batch=32, vocab_size=30528, pad_to_multiple_of=8)) == [
        "micro-batch", "sequence length"]
    assert shapes.flags(0, micro_batch=3, vocab_size=7, pad_to_multiple_of=None) == {}  # no rule (CPU)


def test_audit_gives_the_flags_and_one_line_of_advice():
    assert shapes.audit(CPU, 12, 30522, None) is None
    assert shapes.audit(T4, 32, 30528, 8) == {"multiple": 8, "not_multiples": [], "flags": [], "advice": None}
    found = shapes.audit(A100, 32, 30522, 64)
    assert found["not_multiples"] == ["micro-batch", "vocabulary"]
    assert found["flags"] == ["micro-batch 32 is not a multiple of 64", "vocabulary size 30522 is not a multiple of 64"]
    assert "\n" not in found["advice"] and "multiples of 64 on a100_40gb" in found["advice"]
    assert "data.pad_to_multiple_of=64" in found["advice"]


def test_padded_batches_are_multiples_of_pad_to_multiple_of(tmp_path):
    def batch_lengths(overrides, job_dir):
        built = build_job(TINY + overrides, job_dir)
        try:
            return {b["input_ids"].shape[1] for b in built.trainer.get_train_dataloader()}
        finally:
            release(built)

    padded = batch_lengths(["data.pad_to_multiple_of=8", "max_seq_len=64"], tmp_path / "padded")
    assert padded and all(n % 8 == 0 and n <= 64 for n in padded)
    longest = batch_lengths(["max_seq_len=64"], tmp_path / "longest")  # the default: each batch's longest
    assert any(n % 8 for n in longest)


def test_pad_to_multiple_of_must_divide_max_seq_len(tmp_path):
    with pytest.raises(SystemExit) as done:  # a single run's bad input: exit 2 after results.json
        run_job(TINY + ["data.pad_to_multiple_of=8", "max_seq_len=60"], tmp_path, exits=True)
    assert done.value.code == 2
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["status"] == "failed"
    assert res["reason"].startswith("bad input: data.pad_to_multiple_of: 8 must be a positive divisor of "
                                    "max_seq_len=60")


def test_a_cpu_job_records_no_shape_advice(tmp_path):
    res = run_job(TINY + ["max_steps=1", "hardware=cpu"], tmp_path)
    assert res["status"] == "ok" and res["shape_advice"] is None


@pytest.mark.fast
def test_estimate_on_a_gpu_profile_flags_and_padding_clears_the_sequence(tmp_path, capsys):
    flagged = run_job(TINY + ["mode=estimate", "hardware=t4", "batch_size=12"], tmp_path / "a")
    assert flagged["status"] == "ok"
    assert flagged["shape_advice"]["not_multiples"] == ["micro-batch", "sequence length", "vocabulary"]
    assert flagged["estimate"]["shape_advice"] == flagged["shape_advice"]
    printed = capsys.readouterr().out
    assert "micro-batch 12 is not a multiple of 8" in printed and "advice: pad the vocabulary" in printed

    padded = run_job(TINY + ["mode=estimate", "hardware=t4", "batch_size=16", "data.pad_to_multiple_of=8"],
                     tmp_path / "b")
    assert padded["shape_advice"]["not_multiples"] == ["vocabulary"]  # 30522 tokens: only the vocabulary left

    table = sweep_table([SweepJob(0, ["batch_size=12"], "ok", estimate=flagged["estimate"]),
                         SweepJob(1, ["batch_size=16"], "ok", estimate=padded["estimate"])])
    lines = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("|")]
    column = lines[0].index("not a tensor-core multiple")
    assert [row[column] for row in lines[2:]] == ["micro-batch, sequence length, vocabulary", "vocabulary"]
    assert table.count("tensor-core shapes: pad the vocabulary") == 1  # one advice line for the sweep


def test_job_summary_prints_the_flags(tmp_path, capsys):
    res = results.Result.start(["hardware=t4"], "0" * 16)
    res.end("unsupported", "no-gpu: ...")
    res.shape_advice = shapes.audit(T4, 12, 30522, 8)
    print_summary(res, tmp_path)
    out = capsys.readouterr().out
    assert "tensor cores (multiples of 8): micro-batch 12 is not a multiple of 8; vocabulary size 30522" in out
    assert "  advice: pad the vocabulary" in out


@pytest.mark.fast
def test_sweep_summary_has_a_column_and_the_advice(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", {0: (1.0, 100.0, 0.85), 1: (0.75, 50.0, 0.84)},
                       grid=["optim=adamw,sgd", "model=tiny"])
    for num, advice in ((0, shapes.audit(T4, 32, 30522, 8)), (1, shapes.audit(T4, 32, 30528, 8))):
        res = ok_results(json.loads((sweep / str(num) / "results.json").read_text())["overrides"], 1.0, 100.0, 0.85)
        res["shape_advice"] = advice
        results.write(sweep / str(num) / "results.json", res)
    summary = report.build(sweep)
    report.write(summary)
    assert list(summary.table["tensor_core_shapes"]) == ["vocabulary", "ok (x8)"]
    md = (sweep / "summary.md").read_text()
    assert "not a tensor-core multiple" in md and "| vocabulary " in md and "| ok (x8) " in md
    assert "- tensor-core shapes: pad the vocabulary" in md
    import pandas as pd

    csv = pd.read_csv(sweep / "summary.csv")
    assert json.loads(csv.loc[0, "shape_advice.flags"]) == ["vocabulary size 30522 is not a multiple of 8"]


def test_a_cpu_sweep_summary_has_no_shape_column(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", {0: (1.0, 100.0, 0.85), 1: (0.75, 50.0, 0.84)},
                       grid=["optim=adamw,sgd", "model=tiny"])
    assert "tensor-core" not in report.build(sweep).markdown


@pytest.mark.parametrize("value", [0, -8])
def test_pad_to_multiple_of_must_be_positive(value):
    from memsweep.config.validate import check_padding
    from memsweep.errors import ConfigError

    with pytest.raises(ConfigError, match="data.pad_to_multiple_of"):
        check_padding(64, value)
