"""task=image_classification: every technique's measurable effect on a vision transformer (the tiny random
ViT, a few steps), the trace against the measured peak of the same jobs, the hub ViTs estimated offline, and
the embedded digits."""
import json
from pathlib import Path

import pytest
import torch

from conftest import THREADS, build_job, job_of, run_job
from memsweep.estimate import core
from surfaces import assert_refused, refusal, train_py

ARCHS = Path(__file__).resolve().parents[1] / "src" / "memsweep" / "archs"

# One worker runs the whole module (`make test`: --dist loadgroup), so its module fixture's jobs run once.
pytestmark = pytest.mark.xdist_group("vision")

VIT = ["task=image_classification", "model=tiny-vit", "data.train_size=64", "data.eval_size=32", "logger=none",
       f"threads={THREADS}", "max_steps=2", "batch_size=32"]
# Matrices of 64 x 128 (8,192 elements): bitsandbytes keeps 32-bit state below 4,096, the tiny ViT's size
WIDER = ["model.hidden_size=64", "model.intermediate_size=128"]
ROWS = {"plain": [], "lora": ["lora=r8"], "frozen": ["freezing=encoder"], "full": ["checkpointing=full"],
        "selective": ["checkpointing=selective"], "adamw_8bit": WIDER + ["optim=adamw_8bit"],
        "adamw_wider": WIDER}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The real results of every row (each stores its own estimate, made before training)."""
    out = {}
    for name, overrides in ROWS.items():
        out[name] = run_job(VIT + overrides, tmp_path_factory.mktemp(name))
        assert out[name]["status"] == "ok", (name, out[name]["reason"])
    return out


def test_lora_adapts_the_attention_projections_and_trains_a_fraction(jobs):
    plain, lora = jobs["plain"]["effective"], jobs["lora"]["effective"]
    assert lora["lora_modules"] == 2 * 3  # q_proj, k_proj, v_proj in each of the 2 blocks
    assert lora["trainable_params"] < 0.5 * plain["trainable_params"]
    assert jobs["lora"]["memory"]["optimizer_bytes"] < jobs["plain"]["memory"]["optimizer_bytes"]


@pytest.mark.fast
def test_the_structure_is_found_from_the_vit(tmp_path):
    from memsweep.run import structure

    model = build_job(VIT, tmp_path).trainer.model
    found = structure.discover(model)
    assert found.layers == "vit.layers" and found.embeddings == ("vit.embeddings",)
    assert found.head == ("classifier",) and set(found.attention) == {"q_proj", "k_proj", "v_proj"}


@pytest.mark.parametrize("option, trainable", [
    ("embeddings", lambda n: not n.startswith("vit.embeddings.")),
    ("encoder", lambda n: n.startswith("classifier.")),
    ("bottom_half", lambda n: not n.startswith(("vit.embeddings.", "vit.layers.0."))),  # 2 blocks
])
def test_freezing_leaves_exactly_the_expected_parameters_trainable(tmp_path, option, trainable):
    model = build_job(VIT + [f"freezing={option}"], tmp_path).trainer.model
    got = {n for n, p in model.named_parameters() if p.requires_grad}
    assert got == {n for n, _ in model.named_parameters() if trainable(n)}


def test_a_frozen_encoder_has_gradients_of_the_head_only(jobs):
    res = jobs["frozen"]
    assert res["effective"]["trainable_params"] == 32 * 10 + 10  # the classifier: 10 digits
    assert res["memory"]["grads_bytes"] == 4 * res["effective"]["trainable_params"]


def test_checkpointing_keeps_fewer_activations_selective_between_none_and_full(jobs):
    held = {name: jobs[name]["memory"]["activations_bytes"] for name in ("plain", "selective", "full")}
    assert jobs["full"]["effective"]["checkpointed_layers"] == 2 == \
        jobs["selective"]["effective"]["checkpointed_layers"]
    assert held["full"] < held["selective"] < held["plain"], held


def test_the_8bit_optimizer_state_is_smaller(jobs):
    eight, adam = jobs["adamw_8bit"], jobs["adamw_wider"]
    assert eight["effective"]["trainable_params"] == adam["effective"]["trainable_params"]
    assert eight["memory"]["optimizer_bytes"] < 0.6 * adam["memory"]["optimizer_bytes"]


@pytest.mark.parametrize("name", sorted(ROWS))
def test_the_trace_predicts_the_measured_peak_within_5_percent(jobs, name):
    res = jobs[name]
    est, mem = res["estimate"], res["memory"]
    assert est["method"] == "trace", est["method_reason"]
    assert est["trace"]["peak_bytes"] == pytest.approx(mem["peak_bytes"], rel=0.05)
    assert est["breakdown"]["params"] == mem["params_bytes"] and est["optimizer_bytes"] == mem["optimizer_bytes"]


@pytest.mark.parametrize("model, params", [("vit-b16", 85.8e6),
                                           pytest.param("vit-l16", 303.3e6, marks=pytest.mark.slow),
                                           pytest.param("vit-h14", 630.8e6, marks=pytest.mark.slow)])
def test_the_hub_vits_are_estimated_offline_from_their_shipped_architecture(model, params):
    # ViT-B/16, L/16, H/14 without the pooler, with a 10-digit head
    est = core.estimate_job(*job_of(["task=image_classification", f"model={model}", "hardware=a100_80gb",
                                     "batch_size=8", "optim=sgd"]))
    assert est.method == "trace" and est.total_params == pytest.approx(params, rel=0.01)


def test_the_shipped_dinov2_giant_is_the_1_1b_vit_g14():
    # DINOv2's ViT-g/14 ("1.1B"): 40 blocks of 1536 with 24 heads, biased q/k/v/o, layer scale and a SwiGLU MLP of
    # 4096 (gate and up, then down), a class and a mask token, 37 x 37 + 1 positions at the hub's 518 x 518
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(**json.loads((ARCHS / "dinov2-giant.json").read_text()))
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    d, mlp = 1536, 4096
    embeddings = 2 * d + (37 * 37 + 1) * d + d * 3 * 14 * 14 + d
    block = 2 * 2 * d + 4 * (d * d + d) + 2 * d + 2 * (d * mlp + mlp) + mlp * d + d
    assert sum(p.numel() for p in model.parameters()) == embeddings + 40 * block + 2 * d == 1_136_480_768


# (arguments, the key the one line names): mistakes of the image task, refused before any work
BAD = {
    "a text encoder for images": (["task=image_classification", "model=minilm"], "task"),
    "a vision transformer for text": (["model=tiny-vit"], "task"),
    "a vision transformer as a causal LM": (["task=causal_lm", "model=tiny-vit"], "task"),
    "tweets for the image task": (["task=image_classification", "data=tweets"], "data"),
    "digits for the text task": (["data=digits"], "data"),
    "an image model type that is not": (["task=image_classification", "model=tiny-vit",
                                         "model.architecture=nosuchvit"], "model.architecture"),
    "an image model offline": (["task=image_classification", "model=vit-b16", "model.path=nosuch/vit"],
                               "model.path"),
    "BERT's module names on a ViT": (["task=image_classification", "model=tiny-vit", "lora=r8",
                                      "lora.target_modules=[query,value]"], "lora.target_modules"),
    "fewer digits held out than classes": (["task=image_classification", "data.eval_size=5"], "data.eval_size"),
    "a digit that is not": (["task=image_classification", "data.labels=[1,7,x]"], "data.labels"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_of_the_image_task_is_one_line_naming_the_key(case, tmp_path, capsys, no_work):
    args, key = BAD[case]
    outcome = refusal(lambda: train_py(["logger=none", "data.train_size=64", *args], tmp_path / "job"), capsys)
    assert_refused(outcome, key)


def test_a_refused_task_offers_only_the_tasks_the_model_can_take(tmp_path, capsys, no_work):
    _, errors, _, _ = refusal(lambda: train_py(["model=tiny-vit", "logger=none"], tmp_path / "job"), capsys)
    assert "allowed: task=image_classification with this model, or model=" in errors[0], errors
