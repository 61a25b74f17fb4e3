"""A real job end to end: results.json with every field measured, W&B records, bad input, multirun."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, TINY, build_job, run_job
from memsweep.run import results
from wandb_records import find_run_file, run_contents

# One worker runs the whole module (`make test`: --dist loadgroup), so its module fixture's jobs run once.
pytestmark = pytest.mark.xdist_group("job")

REQUIRED = {
    "metrics": ["f1", "accuracy", "train_loss", "eval_loss"],
    "time": ["train_s", "total_s", "samples_per_s", "tokens_per_s"],
    "memory": ["peak_bytes", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "device",
               "cuda_max_allocated", "cuda_max_reserved", "process_peak_rss"],
}


@pytest.fixture(scope="module")
def tiny_result(tmp_path_factory):
    job_dir = tmp_path_factory.mktemp("tiny") / "job"
    res = run_job(TINY + ["logger=wandb"], job_dir)
    return res, job_dir


@pytest.mark.fast
def test_results_json_holds_every_field_with_measured_values(tiny_result):
    res, job_dir = tiny_result
    on_disk = json.loads((job_dir / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(res, default=str))
    assert on_disk["status"] == "ok" and on_disk["reason"] is None
    assert on_disk["overrides"] == TINY + ["logger=wandb"] and len(on_disk["config_hash"]) == 16
    for section, keys in REQUIRED.items():
        for key in keys:
            assert key in on_disk[section], f"{section}.{key} missing"
    assert all(on_disk["time"][k] > 0 for k in REQUIRED["time"])
    mem = on_disk["memory"]
    assert mem["device"] == "cpu" and mem["cuda_max_allocated"] is None  # no GPU: null, never invented
    assert mem["process_peak_rss"] > mem["peak_bytes"] > 0
    assert on_disk["versions"]["torch"].startswith("2.13.0")


def test_metrics_are_the_evaluations_of_the_trained_model(tiny_result, tmp_path):
    # The same job built again in this process trains to the same weights (same seed); its eval-set
    # predictions, scored here, must give exactly the stored metrics.
    from sklearn.metrics import accuracy_score, f1_score

    from memsweep.run.train_loop import release

    res, _ = tiny_result
    built = build_job(TINY, tmp_path / "again")
    try:
        out = built.trainer.train()
        prediction = built.trainer.predict(built.data.eval)
    finally:
        release(built)
    labels = np.asarray(built.data.eval["labels"])
    predicted = prediction.predictions.argmax(axis=-1)
    assert len(labels) == len(predicted) == res["data"]["eval_examples"] == 100
    metrics = res["metrics"]
    assert metrics["f1"] == pytest.approx(f1_score(labels, predicted, average="macro"), abs=1e-12)
    assert metrics["accuracy"] == pytest.approx(accuracy_score(labels, predicted), abs=1e-12)
    assert metrics["train_loss"] == pytest.approx(out.training_loss, rel=1e-6)
    assert metrics["eval_loss"] == pytest.approx(prediction.metrics["test_loss"], rel=1e-6)
    assert np.isfinite(metrics["eval_loss"]) and metrics["train_loss"] > 0


@pytest.mark.fast
def test_ledger_is_exact_for_weights_gradients_and_adam_state(tiny_result):
    res, _ = tiny_result
    mem, eff = res["memory"], res["effective"]
    fp32_param_bytes = 4 * eff["total_params"]
    assert mem["params_bytes"] == fp32_param_bytes
    # AdamW: exp_avg + exp_avg_sq in fp32, plus one 4-byte step counter per parameter tensor
    adam_state = 2 * 4 * eff["trainable_params"]
    assert adam_state < mem["optimizer_bytes"] <= adam_state + 8 * 64
    assert mem["activations_bytes"] > 0
    assert sum(mem["peak_breakdown"].values()) == mem["peak_bytes"]
    assert mem["ledger_seq_len"] == 64 and mem["ledger_step"] == 2


def test_ledger_does_not_depend_on_which_batches_were_measured(tmp_path):
    # different seeds draw different (differently long) batches; the measured step is padded to max_seq_len
    a, b = run_job(TINY + ["seed=1"], tmp_path / "a"), run_job(TINY + ["seed=2"], tmp_path / "b")
    assert a["metrics"]["train_loss"] != b["metrics"]["train_loss"]  # the seeds did draw different runs
    a, b = a["memory"], b["memory"]
    assert a["peak_bytes"] == b["peak_bytes"] and a["activations_bytes"] == b["activations_bytes"]


@pytest.mark.fast
def test_wandb_offline_run_holds_the_config_and_the_summary(tiny_result):
    res, job_dir = tiny_result
    run = run_contents(find_run_file(job_dir))
    assert run["run"].job_type == "train" and run["run"].display_name == ",".join(res["overrides"])
    assert run["config"]["model"]["name"] == "tiny" and run["config"]["batch_size"] == 32
    assert run["config"]["effective"]["optimizer"] == "AdamW"
    summary = run["summary"]
    assert summary["status"] == "ok" and summary["metrics.f1"] == pytest.approx(res["metrics"]["f1"])
    assert summary["memory.peak_bytes"] == res["memory"]["peak_bytes"]


def test_bad_input_is_a_failed_result_and_a_clear_exit(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_job(TINY + ["data=csv", f"data.path={tmp_path}/missing.csv"], tmp_path / "job", exits=True)
    assert stop.value.code == 2
    assert "memsweep: error: data.path: file" in capsys.readouterr().out
    saved = results.read(tmp_path / "job" / "results.json")
    assert saved["status"] == "failed" and "data.path" in saved["reason"]


def test_bad_input_inside_a_sweep_is_that_jobs_result_and_the_sweep_goes_on(tmp_path, capsys):
    res = run_job(TINY + ["data=csv", f"data.path={tmp_path}/missing.csv"], tmp_path / "job", multirun=True)
    assert res["status"] == "failed" and res["reason"].startswith("bad input: data.path")
    assert "memsweep: error: data.path" in capsys.readouterr().out


def test_a_nan_after_the_last_logged_step_is_still_diverged(tiny_job):
    # 5 steps: Trainer logs every 10, so only the mean training loss can show the NaN
    res = tiny_job("precision=fp16", "lr=1e4", "max_steps=5")
    assert res["status"] == "diverged", res["reason"]


def test_online_without_a_server_falls_back_to_offline_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # closed port on loopback
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    from memsweep.config.schema import LoggerConf
    from memsweep.sweep import wandb_log

    started = time.perf_counter()
    run = wandb_log.start(LoggerConf(init_timeout_s=5), tmp_path, group="g", name="n", job_type="train",
                          config={"a": 1}, tags=[])
    assert time.perf_counter() - started < 15
    assert run.settings.mode == "offline"
    run.finish()


@pytest.fixture(scope="module")
def wandb_sweep(tmp_path_factory):
    """A two-job sweep with W&B in a fresh process, as a person starts one: (its args, the sweep dir, the empty
    HOME it ran with). wandb puts its debug logs under ~/.cache/wandb even offline and given dir=, and its
    settings under ~/.config/wandb: the job points them all into its job dir. So the process gets an empty HOME
    and no WANDB_* variable: an in-process job of this session has set the WANDB_*_DIR ones, and WANDB_SERVICE
    would hand the child's run to this process's wandb-core, which writes elsewhere."""
    tmp_path = tmp_path_factory.mktemp("wandb_sweep")
    home, sweep = tmp_path / "home", tmp_path / "sweep"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_DATA_HOME=str(home / ".local" / "share"), WANDB_MODE="offline", WANDB_SILENT="true")
    # the sweep's summary plot starts matplotlib, whose font cache has its own variable
    env["MPLCONFIGDIR"] = str(tmp_path / "matplotlib")
    args = [a for a in TINY if a != "logger=none"] + ["max_steps=2"]
    done = subprocess.run([sys.executable, "train.py", "-m", "seed=1,2", *args, f"hydra.sweep.dir={sweep}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return args, sweep, home


# The first of these two tests to run runs the sweep (the `wandb_sweep` fixture): both are slow.
@pytest.mark.slow  # a sweep in a subprocess
def test_wandb_writes_nothing_outside_the_job_dir(wandb_sweep):
    _, sweep, home = wandb_sweep
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert written == [], f"written outside the job dir, under HOME: {written}"
    for job_dir in (sweep / "0", sweep / "1"):
        assert run_contents(find_run_file(job_dir))["run"] is not None
    # the debug log that would have gone under HOME (one wandb-core per process: the first job's dir holds it)
    assert list(sweep.rglob("core-debug-*.log"))


@pytest.mark.slow  # a sweep in a subprocess
def test_multirun_gives_one_result_and_one_wandb_run_per_job_in_one_group(wandb_sweep):
    args, sweep, _ = wandb_sweep
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in jobs] == ["0", "1"]
    runs = [run_contents(find_run_file(p))["run"] for p in jobs]
    assert all(results.read(p / "results.json")["status"] == "ok" for p in jobs)
    assert runs[0].run_group == runs[1].run_group and runs[0].run_id != runs[1].run_id
    assert [r.display_name for r in runs] == [f"seed={s},{','.join(args)}" for s in (1, 2)]
