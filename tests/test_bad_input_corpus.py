"""A corpus of mistakes as a new user types them on four surfaces: decoders (train.py, task=causal_lm),
estimates (mode=estimate and `python -m memsweep.app.estimate`), overrides (the command line) and searches
(hparams_search=optuna). Each must end clean: one line `memsweep: error: <key>: ...` (or the status
`unsupported` where a rule refuses), no traceback, exit 2 (or 5), nothing loaded, trained or estimated,
in under 5 s. All run in this process as their commands run them (surfaces.py); one per surface also runs
as the real command, in a subprocess (slow)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from surfaces import assert_refused, estimate_cli, refusal, search_start, train_py

SMALL = ["data.train_size=256", "data.eval_size=100", "logger=none"]
DECODER = ["model=tiny-llama", "task=causal_lm"]
README = str(ROOT / "README.md")
NO_CONFIG = str(ROOT / "conf")  # a folder without config.json
SEARCH = ["-m", "hparams_search=optuna"]

# id: (surface, arguments, the key the line names; "unsupported:<rule>" for a rule's refusal)
CORPUS = {
    # decoders
    "D01 causal LM on the embedded encoder": ("train", ["model=minilm", "task=causal_lm"], "task"),
    "D02 causal LM on the tiny BERT": ("train", ["model=tiny", "task=causal_lm"], "task"),
    "D03 key/value heads that do not divide": ("train", DECODER + ["+model.overrides.num_key_value_heads=3"],
                                               "model.overrides.num_key_value_heads"),
    "D04 pad token past the vocabulary": ("train", DECODER + ["model.overrides.pad_token_id=50000"],
                                          "model.overrides.pad_token_id"),
    "D05 kv heads by their own key": ("train", ["model=tiny-qwen2", "task=causal_lm", "model.num_kv_heads=3"],
                                      "model.num_kv_heads"),
    "D06 sequence past GPT-2's positions": ("train", ["model=tiny-gpt2", "task=causal_lm", "max_seq_len=1024"],
                                            "max_seq_len"),
    "D07 BERT's module names on Llama": ("train", DECODER + ["lora=r8", "lora.target_modules=[query,value]"],
                                         "lora.target_modules"),
    "D08 Llama's module names on GPT-2": ("train", ["model=tiny-gpt2", "task=causal_lm", "lora=r8",
                                                    "lora.target_modules=[q_proj,v_proj]"], "lora.target_modules"),
    "D09 4-bit base without LoRA": ("train", DECODER + ["lora.quantize=nf4"], "lora.quantize"),
    "D10 text column that is not there": ("train", DECODER + ["data.text_column=tweet"], "data.text_column"),
    "D11 capacity below the weights": ("train", DECODER + ["hardware=cpu", "hardware.memory_gib=0.01"],
                                       "hardware.memory_gib"),
    "D12 a hub tokenizer offline": ("train", DECODER + ["model.tokenizer=gpt2"], "model.tokenizer"),
    "D13 a GPU profile on this CPU": ("train", DECODER + ["hardware=t4"], "unsupported:no-gpu"),
    "D14 an activation transformers lacks": ("train", DECODER + ["+model.overrides.hidden_act=swiglu"],
                                             "model.overrides.hidden_act"),
    # estimates
    "E01 past Llama 3.1's positions": ("train", ["mode=estimate", "model=llama-3.1-8b", "task=causal_lm",
                                                  "max_seq_len=200000"], "max_seq_len"),
    "E02 README as the architecture": ("train", ["mode=estimate", *DECODER, f"model.config={README}"],
                                       "model.config"),
    "E03 short module names": ("train", ["mode=estimate", "model=llama-3.1-8b", "task=causal_lm", "lora=qlora",
                                         "lora.target_modules=[q,v]"], "lora.target_modules"),
    "E04 a GPU that has no profile": ("train", ["mode=estimate", "model=qwen2.5-7b", "task=causal_lm",
                                                "hardware=a100"], "hardware"),
    "E05 DistilBERT as a causal LM": ("train", ["mode=estimate", "model=distilbert", "task=causal_lm"], "task"),
    "E06 weights folder that is not there": ("train", ["mode=estimate", "model=llama-3.2-1b", "task=causal_lm",
                                                       "model.path=~/models/llama-3.2-1b"], "model.path"),
    "E07 a folder without config.json": ("train", ["mode=estimate", "model=llama-3.2-1b", "task=causal_lm",
                                                   f"model.path={NO_CONFIG}"], "model.path"),
    "E08 CLI: thousands separator": ("cli", ["model=llama-3.2-1b", "task=causal_lm", "batch_size=1",
                                             "max_seq_len=1,024"], "max_seq_len"),
    "E09 CLI: ZeRO stage without DeepSpeed": ("cli", ["model=mistral-7b", "task=causal_lm", "hardware=t4",
                                                      "deepspeed.stage=3"], "deepspeed.stage"),
    "E10 CLI: kv heads of Llama 3.1": ("cli", ["model=llama-3.1-8b", "task=causal_lm",
                                               "+model.overrides.num_key_value_heads=5"],
                                       "model.overrides.num_key_value_heads"),
    "E11 CLI: a quantization that is not": ("cli", ["--by", "hardware", "hardware=t4,a100_40gb", "model=qwen2.5-0.5b",
                                                    "task=causal_lm", "lora=qlora", "lora.quantize=nf8"],
                                            "lora.quantize"),
    "E12 CLI: a scheduler that is not": ("cli", ["model=llama-3.1-8b", "task=causal_lm",
                                                 "optim.scheduler=cosine_decay"], "optim.scheduler"),
    # overrides
    "O01 a Unicode minus": ("train", ["lr=3e−4"], "lr"),
    "O02 a thousands separator": ("train", ["batch_size=1,000"], "batch_size"),
    "O03 a no-break space": ("train", ["data.train_size=2\u00a0000"], "data.train_size"),
    "O04 a decimal comma": ("train", ["lr=0,0003"], "lr"),
    "O05 a float for an integer": ("train", ["batch_size=32.0"], "batch_size"),
    "O06 a config key without +": ("train", DECODER + ["model.overrides.rope_theta=1e6"],
                                   "model.overrides.rope_theta"),
    "O07 a config key the model sets, with +": ("train", DECODER + ["+model.overrides.pad_token_id=0"],
                                                "model.overrides.pad_token_id"),
    "O08 Lightning's precision name": ("train", ["precision=bf16-mixed"], "precision"),
    "O09 two values without -m": ("train", ["optim.lr=1e-4,3e-4"], "optim.lr"),
    "O10 a rank in words": ("train", ["lora=r8", "lora.r=eight"], "lora.r"),
    "O11 a key the optimizer lacks": ("train", ["optim.beta1=0.9"], "optim.beta1"),
    "O12 a key added with +": ("train", ["+optim.betas=[0.9,0.95]"], "optim.betas"),
    "O13 an interpolation typo": ("train", ["lr=${optim.lrr}"], "lr"),
    "O14 a yes-or-no that is neither": ("train", ["data.drop_duplicates=maybe"], "data.drop_duplicates"),
    # searches
    "S01 F1 for a causal LM": ("search", DECODER + ["search.metric=f1"], "search.metric"),
    "S02 perplexity for a classifier": ("search", ["search.metric=perplexity"], "search.metric"),
    "S03 maximising perplexity": ("search", DECODER + ["hydra.sweeper.direction=maximize"], "hydra.sweeper.direction"),
    "S04 minimising accuracy": ("search", ["search.metric=accuracy", "hydra.sweeper.direction=minimize"],
                                "hydra.sweeper.direction"),
    "S05 a metric in capitals": ("search", ["search.metric=F1"], "search.metric"),
    "S06 a budget of nothing": ("search", ["search.max_peak_gib=0"], "search.max_peak_gib"),
    "S07 trials under the wrong group": ("search", ["hparams_search.n_trials=5"], "hparams_search.n_trials"),
    "S08 a loss that is not reported": ("search", DECODER + ["search.metric=loss"], "search.metric"),
}


def run_surface(surface: str, args: list[str], tmp_path):
    if surface == "train":
        return lambda: train_py([*SMALL, *args], tmp_path / "job")
    if surface == "cli":
        return lambda: estimate_cli(args, tmp_path / "estimate")
    return lambda: search_start([*SEARCH, *SMALL, *args])


# One mistake per surface in the quick lane (`make test-fast`): the command line, the estimate CLI, a search.
FAST = {"O01 a Unicode minus", "E09 CLI: ZeRO stage without DeepSpeed", "S05 a metric in capitals"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.fast) if c in FAST else c for c in sorted(CORPUS)])
def test_the_corpus_is_clean(case, tmp_path, capsys, no_work):
    surface, args, key = CORPUS[case]
    outcome = refusal(run_surface(surface, args, tmp_path), capsys)
    if key.startswith("unsupported:"):
        assert_refused(outcome, key.partition(":")[2], code=5)
    else:
        assert_refused(outcome, key)


def test_the_corpus_covers_each_surface_with_40_mistakes():
    surfaces = [surface for surface, _, _ in CORPUS.values()]
    assert len(CORPUS) >= 40 and {"train", "cli", "search"} <= set(surfaces)
    assert {case[0] for case in CORPUS} == {"D", "E", "O", "S"}


# One per surface as the real command (a fresh process: imports included, so no time limit here).
COMMANDS = {
    "decoder": (["train.py", *SMALL, *DECODER, "+model.overrides.num_key_value_heads=3"],
                "model.overrides.num_key_value_heads"),
    "estimate": (["train.py", "mode=estimate", "model=llama-3.1-8b", "task=causal_lm", "max_seq_len=200000"],
                 "max_seq_len"),
    "estimate CLI": (["-m", "memsweep.app.estimate", "model=llama-3.1-8b", "task=causal_lm",
                      "+model.overrides.num_key_value_heads=5"], "model.overrides.num_key_value_heads"),
    "override": (["train.py", "lr=3e−4"], "lr"),
    "search": (["train.py", *SEARCH, *SMALL, *DECODER, "search.metric=f1"], "search.metric"),
}


@pytest.mark.slow  # fresh processes
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_real_commands_refuse_in_one_line(command, tmp_path):
    args, key = COMMANDS[command]
    where = ["--out", str(tmp_path / "out")] if args[0] == "-m" else [f"hydra.run.dir={tmp_path / 'job'}",
                                                                         f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    done = subprocess.run([sys.executable, *args, *where], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"})
    printed = done.stdout + done.stderr
    errors = [line for line in printed.splitlines() if line.startswith("memsweep: error: ")]
    assert done.returncode == 2, printed[-2000:]
    assert len(errors) == 1 and errors[0].startswith(f"memsweep: error: {key}: "), errors
    assert "Traceback" not in printed
    for saved in tmp_path.rglob("results.json"):  # nothing trained: a job that started ended as bad input
        assert json.loads(saved.read_text())["reason"].startswith("bad input: ")
    assert not (tmp_path / "sweep" / "0").exists()  # no trial of a refused search
