"""lora.quantize (techniques/quantize.py): every linear layer of the blocks quantized, for every architecture,
in the real model and in the estimate's meta model through one function; the audit that says so; a job whose
blocks cannot be quantized ends unsupported instead of training unquantized."""
import copy

import pytest

from conftest import job_of, run_job
from memsweep.errors import Unsupported
from memsweep.estimate.core import estimate_job
from memsweep.estimate.meta import bitsandbytes_layers, traced_model
from memsweep.run import model as model_mod
from memsweep.run import task
from memsweep.run.setup import build_setup
from memsweep.techniques import quantize

DECODER = ["task=causal_lm", "model=tiny-llama"]
# each family as the tiny model memsweep builds of it; gemma2 has no sdpa kernel in transformers (eager)
FAMILIES = {
    **{arch: [*DECODER, f"model.architecture={arch}"]
       for arch in ("llama", "mistral", "qwen2", "gemma", "phi", "phi3", "falcon", "gpt_neox", "gpt2", "opt")},
    "gemma2": [*DECODER, "model.architecture=gemma2", "attention=eager"],
    "bert": ["model=tiny"],
    "vit": ["task=image_classification", "model=tiny-vit", "data=digits"],
}
OPTIONS = ("qlora", "int8")


def both_models(args: list[str]):
    """(the estimate's meta model, the real model) of a job, each as the job builds it, and the blocks' name."""
    job, profile = job_of(args)
    setup = build_setup(job, profile)
    meta = traced_model(job, setup)
    tokenizer = None if task.images(job.task) else model_mod.load_tokenizer(job.model)
    real = setup.transform(model_mod.load_model(job.model, task.num_labels(job.task, job.data.labels),
                                                setup.load_kwargs, task.auto_class(job.task), tokenizer))
    return meta, real, setup.structure.layers


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_linear_of_the_blocks_is_quantized_in_the_real_model_and_the_estimate(family, option):
    meta, real, layers = both_models([*FAMILIES[family], f"lora={option}"])
    traced, measured = quantize.audit(meta, layers), quantize.audit(real, layers)
    assert measured.quantized > 0 and measured.share == 1.0, measured
    assert traced == measured  # the same layers, elements and stored bytes
    per_element = 0.5 if option == "qlora" else 1
    assert measured.quantized_bytes == pytest.approx(measured.quantized_params * per_element, abs=measured.quantized)


@pytest.mark.fast
def test_transformers_alone_leaves_falcons_linear_subclass_unquantized():
    # what quantize_blocks is for: transformers' quantizer replaces `type(module) is nn.Linear` only
    job, profile = job_of([*FAMILIES["falcon"], "lora=qlora"])
    setup = build_setup(job, profile)
    model = copy.deepcopy(model_mod.meta_model(job.model, task.auto_class(job.task), 2))
    bitsandbytes_layers(model, setup.load_kwargs["quantization_config"])
    assert quantize.audit(model, setup.structure.layers).share == 0.0
    quantize.quantize_blocks(model, setup.load_kwargs["quantization_config"], setup.structure.layers)
    assert quantize.audit(model, setup.structure.layers).share == 1.0


def test_a_falcon_qlora_job_trains_a_4_bit_base_and_its_estimate_says_so(tmp_path):
    args = [*FAMILIES["falcon"], "lora=qlora", "data.train_size=64", "data.eval_size=16", "max_steps=2",
            "logger=none", "batch_size=8"]
    res = run_job(args, tmp_path)
    assert res["status"] == "ok", res["reason"]
    audit = res["effective"]["quantization"]
    assert audit["quantized"] == 8 and audit["unquantized"] == 0, audit  # 2 blocks x 4 linear layers
    assert res["effective"]["param_dtypes"]["uint8"] == audit["quantized_bytes"]
    assert res["estimate"]["trace"]["quantization"] == audit
    assert res["estimate"]["peak_bytes"] == pytest.approx(res["memory"]["peak_bytes"], rel=1e-3)


def test_blocks_bitsandbytes_cannot_quantize_end_unsupported_in_the_estimate_and_the_job(tmp_path):
    # Mixtral's experts are 3-D parameters, not linear layers: most of its blocks' weights stay unquantized
    args = [*DECODER, "model.architecture=mixtral", "lora=qlora"]
    with pytest.raises(Unsupported, match=r"lora.quantize=nf4: \d+% of the blocks' weights quantized"):
        estimate_job(*job_of(args))
    res = run_job([*args, "data.train_size=64", "data.eval_size=16", "max_steps=1", "logger=none"], tmp_path)
    assert res["status"] == "unsupported" and "experts" in res["reason"], res["reason"]
