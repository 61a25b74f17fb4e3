"""Bad input never runs: each case ends before the model is loaded, in seconds, as one line naming the
key and what is allowed, with exit code 2 and a `failed: bad input` result; in a sweep it is that job's
row and the sweep goes on."""

import pytest

from conftest import ROOT, TINY, run_job
from memsweep.run import model
from surfaces import assert_refused, estimate_cli, refusal, search_start, train_py

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
    "epochs negative": (["epochs=-1"], "epochs", "a finite number > 0"),
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
    "no nodes": (["distributed.nodes=0"], "distributed.nodes", "an integer > 0"),
    "node rank past the nodes": (["distributed.nodes=2", "distributed.node_rank=2",
                                  "distributed.rdzv_endpoint=127.0.0.1:29500"], "distributed.node_rank", "from 0 to"),
    "nodes without a rendezvous": (["distributed.nodes=2"], "distributed.rdzv_endpoint", "host:port of node 0"),
    "rendezvous without a port": (["distributed.nodes=2", "distributed.rdzv_endpoint=node0"],
                                  "distributed.rdzv_endpoint", "host:port of node 0"),
    "nodes do not divide the batch": (["distributed.nodes=3", "distributed.rdzv_endpoint=127.0.0.1:29500"],
                                      "batch_size", "distributed.nodes x distributed.nproc = 3"),
    "zero stage": (["deepspeed=zero2", "deepspeed.stage=4"], "deepspeed.stage", "an integer from 0 to 3"),
    "negative seed": (["seed=-1"], "seed", "from 0 to below 2^32"),
    "padding not a divisor": (["data.pad_to_multiple_of=7"], "data.pad_to_multiple_of", "divisor of max_seq_len"),
    "uncached hub model offline": (["model=bert-base"], "model.path", "not in the Hugging Face cache"),
}


@pytest.fixture
def no_model_loads(monkeypatch, checks_imported):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(model, "load_model", refuse)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_refused_before_any_work(case, tmp_path, capsys, no_model_loads):
    overrides, key, allowed = CASES[case]

    def run() -> int:
        with pytest.raises(SystemExit) as stop:
            run_job(TINY + overrides, tmp_path / "job", exits=True)
        return stop.value.code

    assert_refused(refusal(run, capsys), key, allowed)


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


# --- one table per class of mistake: each refused in one line naming the key, exit 2, in < 5 s, before any
# model is loaded, trained or estimated (conftest.no_work) --------------------------------------------------

DECODER = ["model=tiny-llama", "task=causal_lm"]

# a key with a closed set of values: the schema's Enum lists them (refused on the command line)
CLOSED_SETS = {
    "device": (["hardware.device=gpu"], "hardware.device", "allowed: auto, cpu, cuda"),
    "checkpointing by name": (["checkpointing.name=partial"], "checkpointing.name", "allowed: none, full, selective"),
    "logger by name": (["logger.name=tensorboard"], "logger.name", "allowed: wandb, none"),
    "quantization": (["lora=r8", "lora.quantize=nf8"], "lora.quantize", "allowed: none, int8, nf4"),
    "compile by name": (["compile.name=yes"], "compile.name", "allowed: none, on"),
}

# a free-text key that names something, against what exists
NAMES = {
    "scheduler": (["optim.scheduler=cosine_warmup"], "optim.scheduler", "cosine_with_restarts"),
    "encoding": (["data.encoding=utf-9"], "data.encoding", "not an encoding Python knows"),
    "bytes codec": (["data.encoding=base64"], "data.encoding", "not a text encoding"),
    "backend": (["distributed.backend=nccl2"], "distributed.backend", "gloo"),
    "tflops dtype": (["+hardware.tflops.fp61=3"], "hardware.tflops.fp61", "allowed: bf16, fp16, fp32, fp64, tf32"),
    "lora target": (DECODER + ["lora=r8", "lora.target_modules=[query,value]"], "lora.target_modules",
                    "q_proj, k_proj, v_proj, o_proj"),
    "layers module": (["model.layers_module=encoder.layers"], "model.layers_module", "bert.encoder.layer"),
}

# a key of a group that is off would be ignored
SWITCHES = {
    "quantize without lora": (["lora.quantize=nf4"], "lora.quantize", "lora is off (lora=none)"),
    "stage without deepspeed": (["deepspeed.stage=2"], "deepspeed.stage", "deepspeed is off"),
    "offload without fsdp": (["fsdp.offload=true"], "fsdp.offload", "fsdp is off"),
    "targets without lora": (["lora.target_modules=[query]"], "lora.target_modules", "lora is off"),
    "project without a logger": (["logger.project=mine"], "logger.project", "logger is off"),
}

# model.overrides applied first, the model's checks on the result
OVERRIDES = {
    "kv heads": (DECODER + ["+model.overrides.num_key_value_heads=3"], "model.overrides.num_key_value_heads",
                 "a divisor of 4"),
    "pad token": (DECODER + ["model.overrides.pad_token_id=40000"], "model.overrides.pad_token_id", "0 to 30521"),
    "vocabulary below the special tokens": (DECODER + ["model.vocab_size=100"], "model.overrides.bos_token_id",
                                            "outside the vocabulary of 100"),
    "position limit": (DECODER + ["+model.overrides.max_position_embeddings=32"], "max_seq_len", "from 1 to 32"),
    "activation": (["+model.overrides.hidden_act=swiglu"], "model.overrides.hidden_act", "'swiglu'"),
    "kv heads by name": (["model=tiny-qwen2", "task=causal_lm", "model.num_kv_heads=3"], "model.num_kv_heads",
                         "a divisor of 4"),
}

# a mode that skipped the checks: mode=estimate runs those that need no weights and no data
ESTIMATE_MODE = {
    "position limit": (DECODER + ["mode=estimate", "max_seq_len=4096"], "max_seq_len", "from 1 to 512"),
    "encoder as a causal LM": (["mode=estimate", "task=causal_lm"], "task", "tiny-llama"),
    "lora target": (["mode=estimate", "lora=r8", "lora.target_modules=[q_proj]"], "lora.target_modules", "query"),
    "kv heads": (["mode=estimate", "model=tiny-qwen2", "+model.overrides.num_key_value_heads=3"],
                 "model.overrides.num_key_value_heads", "a divisor of 4"),
}

# the task decides what is valid
TASK = {
    "causal LM on an encoder": (["task=causal_lm"], "task", "'bert' is an encoder"),
    "causal LM on MiniLM": (["model=minilm", "task=causal_lm"], "task", "tiny-gpt2"),
    "label column not in the file": (["data.label_column=label"], "data.label_column",
                                     "columns are ['sentiment', 'confidence', 'text']"),
    "causal LM keeping labels of a missing column": (DECODER + ["data.label_column=label"], "data.label_column",
                                                      "data.labels=['negative', 'positive']"),
    "search metric of the other task": (DECODER + ["search.metric=f1"], "search.metric", "perplexity, eval_loss"),
    "search metric not reported": (["search.metric=recall"], "search.metric", "f1, accuracy"),
}

TABLES = {"closed set": CLOSED_SETS, "name": NAMES, "switch": SWITCHES, "override": OVERRIDES,
          "estimate mode": ESTIMATE_MODE, "task": TASK}


@pytest.mark.parametrize("table, case", [(t, c) for t, cases in TABLES.items() for c in cases])
def test_each_class_of_mistake_is_refused_in_one_line(table, case, tmp_path, capsys, no_work):
    overrides, key, says = TABLES[table][case]
    assert_refused(refusal(lambda: train_py(TINY + overrides, tmp_path / "job"), capsys), key, says)


def _files(tmp_path):
    """Files a person might point a key at by mistake."""
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    (tmp_path / "empty-text.csv").write_text("text,label\n" + "\n".join(f",{'ab'[i % 2]}" for i in range(40)) + "\n")
    two_class_csv(tmp_path / "lonely.csv", labels=("neg",) * 39 + ("pos",))  # one 'pos' row in 40
    return {"folder": folder, "readme": README, "weights": folder / "model.safetensors",
            "empty_text": tmp_path / "empty-text.csv", "lonely": tmp_path / "lonely.csv"}


# any error raised inside the checks, of whatever type, comes out as one line naming the key
TRANSLATED = {
    "folder without config.json": (["model=minilm", "model.path={folder}"], "model.path", "without a config.json"),
    "weights file as the model": (["model=minilm", "model.path={weights}"], "model.path", "a file without"),
    "README as config.json": (DECODER + ["model.config={readme}"], "model.config", "(JSONDecodeError)"),
    "tweets read as utf-16": (["data.encoding=utf-16"], "data.encoding", "is not utf-16 text"),
    "empty text column": (["data=csv", "data.path={empty_text}"], "data.text_column", "has no text"),
    "class with one row": (["data=csv", "data.path={lonely}", "data.text_column=review", "data.label_column=stars",
                            "data.eval_size=10", "data.train_size=null"], "data.label_column",
                           "['pos'] of column 'stars' have fewer than 2"),
    "interpolation typo": (["lr=${{optim.lrr}}"], "lr", "interpolates ${optim.lrr}, which is not a memsweep key"),
}


@pytest.mark.parametrize("case", sorted(TRANSLATED))
def test_any_error_inside_the_checks_is_one_line(case, tmp_path, capsys, no_work):
    overrides, key, says = TRANSLATED[case]
    files = _files(tmp_path)
    args = [o.format(**files) for o in overrides]
    assert_refused(refusal(lambda: train_py(TINY + args, tmp_path / "job"), capsys), key, says)


# numbers as a person types them
NUMBERS = {
    "unicode minus": (["lr=3e−4"], "lr", "minus sign (U+2212) at character 3"),
    "en dash": (["max_steps=–1"], "max_steps", "en dash (U+2013)"),
    "thousands comma": (["data.train_size=2,500"], "data.train_size", "type 2500"),
    "thousands comma in a sweep": (["-m", "batch_size=1,000"], "batch_size", "type 1000"),
    "no-break space": (["data.train_size=2\u00a0000"], "data.train_size", "no-break space"),
    "decimal comma": (["lr=0,0003"], "lr", "type 0.0003"),
    "overridden config key": (DECODER + ["+model.overrides.rope_theta=5e−5"], "model.overrides.rope_theta",
                              "minus sign"),
}


@pytest.mark.parametrize("case", sorted(NUMBERS))
def test_a_number_typed_with_a_wrong_character_says_which(case, tmp_path, capsys, no_work):
    overrides, key, says = NUMBERS[case]
    assert_refused(refusal(lambda: train_py(TINY + overrides, tmp_path / "job"), capsys), key, says)


def test_sweeps_of_numbers_stay_sweeps():
    from memsweep.config.validate_args import arguments

    arguments(["-m", "batch_size=8,128", "epochs=1,2", "lr=1e-4,3e-4", "data.train_size=100,1000"])


def test_a_search_that_cannot_run_is_refused_before_its_first_trial(capsys, checks_imported):
    cases = {  # (arguments, key, what the line says)
        "metric of the other task": (DECODER + ["search.metric=f1"], "search.metric", "perplexity"),
        "direction for the worst": (DECODER + ["hydra.sweeper.direction=maximize"], "hydra.sweeper.direction",
                                    "allowed: minimize"),
        "direction for the worst accuracy": (["search.metric=accuracy", "hydra.sweeper.direction=minimize"],
                                             "hydra.sweeper.direction", "allowed: maximize"),
        "budget below zero": (["search.max_peak_gib=-1"], "search.max_peak_gib", "null or a finite number > 0"),
    }
    for args, key, says in cases.values():
        assert_refused(refusal(lambda args=args: search_start(["-m", "hparams_search=optuna", *TINY, *args]), capsys),
                       key, says)


def test_the_direction_follows_the_metric():
    from memsweep.sweep.search import direction

    assert [direction("classification", None), direction("causal_lm", None), direction("classification", "eval_loss"),
            direction("causal_lm", "train_loss")] == ["maximize", "minimize", "minimize", "minimize"]


def test_the_estimate_cli_runs_the_same_checks(tmp_path, capsys, no_work):
    cases = {
        "position limit": (["model=tiny-llama", "task=causal_lm", "max_seq_len=4096"], "max_seq_len"),
        "switch": (["model=tiny", "deepspeed.stage=3"], "deepspeed.stage"),
        "thousands separator in a grid": (["model=tiny", "max_seq_len=1,024"], "max_seq_len"),
    }
    for n, (args, key) in enumerate(cases.values()):
        assert_refused(refusal(lambda args=args, n=n: estimate_cli(args, tmp_path / str(n)), capsys), key)


def test_a_launcher_whose_extra_is_not_installed_is_refused_in_one_line(monkeypatch):
    from memsweep.config import validate_args
    from memsweep.errors import ConfigError

    monkeypatch.setitem(validate_args.EXTRA_LAUNCHERS, "ray", ("hydra_plugins.no_such_plugin", "ray"))
    with pytest.raises(ConfigError, match=r"hydra/launcher: ray needs the `ray` extra.*pip install -e '\.\[ray\]'"):
        validate_args.arguments(["-m", "hydra/launcher=ray", "optim=adamw,sgd"])
    monkeypatch.setitem(validate_args.EXTRA_LAUNCHERS, "ray", ("hydra_plugins.memsweep_launchers", "ray"))
    validate_args.arguments(["-m", "hydra/launcher=ray", "optim=adamw,sgd"])  # installed: Hydra takes it
