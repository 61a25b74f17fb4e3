"""Facts of a job's keys that need no weights, refused the same in every mode they apply to (run/inputs.py,
run/validate_model.py): the data against the task, an image model's patches against its image, a pretrained
model's shape against its weights' config; and what the machine can run, before any process starts: the
distributed backend, the Slurm launcher, several nodes without a rendezvous. Each is one line naming the
key, exit 2, no traceback, nothing loaded, estimated, planned or launched (surfaces.py, `no_work`)."""
import json

import pytest

from conftest import run_job
from surfaces import assert_refused, estimate_cli, refusal, train_py

SMALL = ["data.train_size=64", "data.eval_size=32", "logger=none"]
VIT = ["task=image_classification", "model=tiny-vit"]
SURFACES = ("train", "train estimate", "estimate cli", "plan")


def surface(name: str, args: list[str], tmp_path):
    """The command a person types, run in this process: train.py (mode=train, estimate or plan) or the CLI."""
    if name == "estimate cli":
        return lambda: estimate_cli(args, tmp_path / "estimate")
    mode = {"train": [], "train estimate": ["mode=estimate"], "plan": ["mode=plan"]}[name]
    return lambda: train_py([*SMALL, *args, *mode], tmp_path / "job")


# (arguments, the key the line names, a piece of the line), refused in every mode
EVERY_MODE = {
    "text data for the image task": ([*VIT, "data=tweets"], "data", "data=tweets is text"),
    "images for a text task": (["model=tiny", "data=digits"], "data", "data=digits is images"),
    "a patch larger than the image": ([*VIT, "data=digits", "model.overrides.patch_size=64"],
                                      "model.overrides.patch_size", "allowed: an integer from 1 to 16"),
    "an image smaller than its patch": ([*VIT, "data=digits", "model.overrides.image_size=2"],
                                        "model.overrides.patch_size", "images of 2 pixels"),
    "a LoRA rank above the narrowest adapted layer": (["model=tiny-llama", "task=causal_lm", "lora=r8", "lora.r=33"],
                                                     "lora.r", "k_proj: 32 features); allowed: an integer from 1 to"),
    "a 4-bit layer the CPU kernel cannot pack": (["model=tiny-llama", "task=causal_lm", "lora=qlora",
                                                   "model.num_kv_heads=1"], "lora.quantize",
                                                  "k_proj is 64 -> 16; allowed: model sizes that make it so"),
    "an attention kernel the model lacks": (["model=tiny-llama", "task=causal_lm", "model.architecture=gemma2"],
                                            "attention", "sdpa is not an attention implementation"),
    "more blocks than the pretrained model": (["model=minilm", "model.num_layers=7"], "model.num_layers",
                                              "7 where the pretrained model=minilm has 6"),
    "a wider pretrained feed-forward": (["model=minilm", "model.intermediate_size=2048"],
                                        "model.intermediate_size", "2048 where the pretrained model=minilm has 1536"),
    "pretrained attention regrouped": (["model=minilm", "model.num_heads=6"], "model.num_heads",
                                       "regrouped into 6 heads"),
    "a larger pretrained vocabulary": (["model=minilm", "model.vocab_size=40000"], "model.vocab_size",
                                       "40000 where the pretrained model=minilm has 30522"),
    "a packaged decoder deepened": (["model=smollm2-135m", "task=causal_lm", "model.num_layers=40"],
                                    "model.num_layers", "40 where the pretrained model=smollm2-135m has 30"),
    "a packaged decoder untied": (["model=smollm2-135m", "task=causal_lm",
                                   "+model.overrides.tie_word_embeddings=false"],
                                  "model.overrides.tie_word_embeddings", "randomly initialised"),
}


@pytest.mark.parametrize("where", SURFACES)
@pytest.mark.parametrize("case", sorted(EVERY_MODE))
def test_a_fact_of_the_keys_is_refused_in_every_mode(case, where, tmp_path, capsys, no_work):
    args, key, says = EVERY_MODE[case]
    assert_refused(refusal(surface(where, args, tmp_path), capsys), key, says)


def test_a_shape_refusal_names_both_values_and_the_key_that_allows_it(tmp_path, capsys, no_work):
    _, errors, _, _ = refusal(surface("estimate cli", ["model=minilm", "model.num_layers=9"], tmp_path), capsys)
    assert "model.num_layers: 9 where the pretrained model=minilm has 6 (config.json of " in errors[0], errors
    assert errors[0].endswith("or set model.new_parts_random=true if random new parts are meant"), errors
    assert "allowed: at most 6 (fewer keeps the first blocks' weights)" in errors[0], errors


def test_fewer_pretrained_blocks_keep_their_weights_and_are_said(tmp_path):
    """A shallower pretrained model adds no random parts: not refused, but the blocks left out are counted."""
    from conftest import compose_config
    from memsweep.run import inputs, validate_model

    job = inputs.job(compose_config(["model=minilm", "model.num_layers=4"]))
    change = validate_model.shape_change(job)
    assert change.new_parameters == 0 and change.dropped_parameters > 0 and change.alters
    unchanged = inputs.job(compose_config(["model=minilm", "model.num_layers=6", "model.vocab_size=30522"]))
    assert validate_model.shape_change(unchanged) is None  # the pretrained values themselves change nothing


@pytest.mark.parametrize("option, task", [("macbert", []), ("distilbert", []), ("bert-base", []),
                                          ("llama-2-7b", ["task=causal_lm"]),
                                          ("vit-b16", ["task=image_classification", "data=digits"])])
def test_the_shipped_model_options_are_their_pretrained_shapes(option, task):
    """A hub option whose keys describe it (its config.json not on disk) or whose config ships with memsweep
    is not a changed model: its estimate is not refused."""
    from conftest import compose_config
    from memsweep.run import inputs, validate_model

    job = inputs.job(compose_config([f"model={option}", "mode=estimate", *task]))
    change = validate_model.shape_change(job)
    assert change is None or not change.alters, change


# (arguments, the key, a piece of the line): what this machine cannot run, refused before any process starts
MACHINE = {
    "nccl without CUDA": (["model=tiny", "distributed.nproc=2", "distributed.backend=nccl"], "distributed.backend",
                          "nccl needs cuda and this machine has no CUDA GPU; allowed: auto"),
    "nccl on the CPU profile": (["model=tiny", "hardware=cpu", "distributed.nproc=2", "distributed.backend=nccl"],
                                "distributed.backend", "the job trains on cpu"),
    "two nodes without a rendezvous": (["model=tiny", "distributed.nodes=2"], "distributed.rdzv_endpoint",
                                       "distributed.nodes=2 outside Slurm"),
}


@pytest.mark.parametrize("case", sorted(MACHINE))
def test_what_the_machine_cannot_run_is_refused_before_any_rank(case, tmp_path, capsys, no_work,
                                                                monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args, key, says = MACHINE[case]
    assert_refused(refusal(surface("train", args, tmp_path), capsys), key, says)


def test_an_estimate_of_several_ranks_needs_no_backend_of_this_machine(monkeypatch):
    import torch

    from conftest import compose_config
    from memsweep.run import inputs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for mode in ("estimate", "plan"):  # sized for the GPUs it names, not run here
        inputs.job(compose_config(["model=tiny", "distributed.nproc=2", "distributed.backend=nccl", f"mode={mode}"]))
    inputs.job(compose_config(["model=tiny", "distributed.nproc=2", "distributed.backend=gloo"]))


def test_the_slurm_launcher_needs_sbatch_on_this_machine(tmp_path, capsys, monkeypatch):
    from memsweep.config.validate_args import arguments

    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    for option in ("slurm", "submitit_slurm"):
        args = ["-m", f"hydra/launcher={option}", "model=tiny"]
        code, _, printed, _ = refusal(lambda: train_py(args, tmp_path), capsys)  # noqa: B023 - called at once
        assert code == 2 and printed.splitlines() == [
            f"memsweep: error: hydra/launcher: {option} submits to Slurm, and this machine has no `sbatch` on PATH "
            "(not a Slurm login node); allowed: basic (Hydra's default: one job after the other), local, parallel, "
            "ray (the `ray` extra) (conf/hydra/launcher)"], printed
    sbatch = tmp_path / "sbatch"
    sbatch.write_text("#!/bin/sh\n")
    sbatch.chmod(0o755)
    arguments(["-m", "hydra/launcher=slurm", "model=tiny"])  # a Slurm login node: submitted as before


@pytest.mark.parametrize("change", ["model.num_layers=7", "model.intermediate_size=1600"])
def test_new_pretrained_parts_when_asked_are_counted_as_transformers_initialises_them(change, tmp_path, capsys):
    """model.new_parts_random=true: the job trains, and results.json and the console count the parameters the
    weights did not hold, as many as transformers' own loading report has missing or resized (the head aside)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from memsweep.run import packaged

    res = run_job(["model=minilm", change, "model.new_parts_random=true", "max_steps=1", "max_seq_len=32",
                   "threads=1", *SMALL], tmp_path / "job")
    assert res["status"] == "ok", res["reason"]
    folder = str(packaged.minilm_folder())
    key, value = change.split("=")
    hf = {"model.num_layers": "num_hidden_layers", "model.intermediate_size": "intermediate_size"}[key]
    config = AutoConfig.from_pretrained(folder, num_labels=3, **{hf: int(value)})
    model, info = AutoModelForSequenceClassification.from_pretrained(
        folder, config=config, output_loading_info=True, ignore_mismatched_sizes=True)
    sizes = {name: p.numel() for name, p in model.named_parameters()}
    initialised = [k for k in info["missing_keys"] if not k.startswith("classifier.")]
    initialised += [k for k, _, _ in info["mismatched_keys"]]
    recorded = res["effective"]["pretrained_shape"]
    assert recorded["new_parameters"] == sum(sizes[k] for k in initialised) > 0
    assert recorded["changed"] == {key: [{"model.num_layers": 6, "model.intermediate_size": 1536}[key], int(value)]}
    saved = json.loads((tmp_path / "job" / "results.json").read_text())
    assert saved["effective"]["pretrained_shape"] == recorded
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[memsweep] model: ")]
    assert lines == [f"[memsweep] model: {key} {recorded['changed'][key][0]} -> {value} changes the pretrained "
                     f"model=minilm: {recorded['new_parameters']:,} parameters randomly initialised, 0 pretrained "
                     "parameters left out"], lines

