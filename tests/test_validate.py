"""Bad input never runs: each case ends before the model is loaded, in seconds, as one line naming the
key and what is allowed, with exit code 2 and a `failed: bad input` result; in a sweep it is that job's
row and the sweep goes on."""
import time

import pytest
from conftest import ROOT, TINY, run_job

from memsweep.run import model

README = str(ROOT / "README.md")


def two_class_csv(path, rows=40, labels=("neg", "pos")):
    lines = ["review,stars"] + [f"text number {i},{labels[i % len(labels)]}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


# (overrides, the key the message must name, a fragment of what it says is allowed or found)
CASES = {
    "batch zero": (["batch_size=0"], "batch_size", "an integer > 0"),
    "batch negative": (["batch_size=-4"], "batch_size", "an integer > 0"),
    "past the position limit": (["max_seq_len=100000"], "max_seq_len", "from 1 to 512"),
    "not a table": (["data=csv", f"data.path={README}"], "data.path", "is not a readable CSV table"),
    "train size negative": (["data.train_size=-1"], "data.train_size", "an integer > 0"),
    "lora rank zero": (["lora=r8", "lora.r=0"], "lora.r", "an integer > 0"),
    "epochs negative": (["epochs=-1"], "epochs", "a number > 0"),
    "unknown key": (["+some_unknown_key=1"], "some_unknown_key", "is not a memsweep key"),
    "unknown nested key": (["+optim.betas=1"], "optim.betas", "the keys here are name, hf_name, lr"),
    "lr zero": (["lr=0"], "lr", "a finite number > 0"),
    "accumulation does not divide": (["accumulation.steps=3"], "batch_size", "not divisible by"),
    "heads do not divide": (["model.num_heads=3"], "model.num_heads", "a divisor of the hidden size"),
    "vocabulary too small": (["model.vocab_size=1000"], "model.vocab_size", "at least 30522"),
    "eval size zero": (["data.eval_size=0"], "data.eval_size", "an integer > 0"),
    "train size above the data": (["data.train_size=10000000"], "data.train_size", "allowed: up to"),
    "max steps zero": (["max_steps=0"], "max_steps", "-1 (train for `epochs`)"),
    "momentum above 1": (["optim=sgd", "optim.momentum=1.5"], "optim.momentum", "from 0 to below 1"),
    "no processes": (["distributed.nproc=0"], "distributed.nproc", "an integer > 0"),
    "zero stage": (["deepspeed=zero2", "deepspeed.stage=4"], "deepspeed.stage", "stage 0, 1, 2 or 3"),
    "negative seed": (["seed=-1"], "seed", "from 0 to 2^32-1"),
    "padding not a divisor": (["data.pad_to_multiple_of=7"], "data.pad_to_multiple_of", "divisor of max_seq_len"),
    "uncached hub model offline": (["model=bert-base"], "model.path", "not in the Hugging Face cache"),
}


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(model, "load_model", refuse)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_refused_before_any_work(case, tmp_path, capsys, no_model_loads):
    overrides, key, allowed = CASES[case]
    started = time.perf_counter()
    with pytest.raises(SystemExit) as stop:
        run_job(TINY + overrides, tmp_path / "job", exits=True)
    took = time.perf_counter() - started
    out, err = capsys.readouterr()
    errors = [line for line in out.splitlines() if line.startswith("memsweep: error: ")]
    assert stop.value.code == 2, out[-2000:]
    assert len(errors) == 1 and errors[0].startswith(f"memsweep: error: {key}: ") and allowed in errors[0], errors
    assert "Traceback" not in out + err and took < 5, took


def test_data_checks_name_the_columns_and_the_classes(tmp_path, capsys, no_model_loads):
    csv = two_class_csv(tmp_path / "reviews.csv")
    wrong_column = run_job(TINY + ["data=csv", f"data.path={csv}", "data.label_column=label"], tmp_path / "a")
    assert wrong_column["reason"] == ("bad input: data.text_column: column 'text' not in file "
                                      f"'{csv}'; columns are ['review', 'stars']")
    one_class = two_class_csv(tmp_path / "one.csv", labels=("pos",))
    res = run_job(TINY + ["data=csv", f"data.path={one_class}", "data.text_column=review",
                          "data.label_column=stars", "data.eval_size=10"], tmp_path / "b")
    assert res["reason"].startswith("bad input: data.label_column: column 'stars' has only ['pos']")


def test_a_good_csv_trains(tmp_path):
    csv = two_class_csv(tmp_path / "reviews.csv", rows=80)
    res = run_job(TINY + ["data=csv", f"data.path={csv}", "data.text_column=review", "data.label_column=stars",
                          "data.eval_size=20", "data.train_size=null", "max_steps=2"], tmp_path / "job")
    assert res["status"] == "ok" and res["data"]["labels"] == ["neg", "pos"]


def test_in_a_sweep_bad_input_is_that_jobs_row(tmp_path, no_model_loads):
    res = run_job(TINY + ["batch_size=0"], tmp_path / "job", multirun=True)
    assert res["status"] == "failed" and res["reason"].startswith("bad input: batch_size: 0 is not allowed")
