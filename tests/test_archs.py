"""The shipped hub architectures (src/memsweep/archs/*.json, config.json contents without weights) build
offline on the meta device and give exactly the parameter counts their publishers report."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

ARCHS = Path(__file__).resolve().parents[1] / "src" / "memsweep" / "archs"

# file stem -> (hub id, published parameter count, whether the head is tied to the token embedding)
PUBLISHED = {
    "qwen2.5-0.5b": ("Qwen/Qwen2.5-0.5B", 494_032_768, True),
    "llama-3.2-1b": ("meta-llama/Llama-3.2-1B", 1_235_814_400, True),
    "llama-3.2-3b": ("meta-llama/Llama-3.2-3B", 3_212_749_824, True),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B", 8_030_261_248, False),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B", 7_615_616_512, False),
    "mistral-7b": ("mistralai/Mistral-7B-v0.3", 7_248_023_552, False),
    "llama-2-7b": ("meta-llama/Llama-2-7b-hf", 6_738_415_616, False),
    # 13,015,864,320: Meta's count for Llama-2-13b-hf (40 x 5120 layers, 13824 MLP, 32000 vocabulary, untied)
    "llama-2-13b": ("meta-llama/Llama-2-13b-hf", 13_015_864_320, False),
    # 1,418,270,720: the hub's count for microsoft/phi-1_5 in transformers' phi format (biased linears and head)
    "phi-1.5": ("microsoft/phi-1_5", 1_418_270_720, False),
    # 3,637,321,728: "number of parameters in https://huggingface.co/stabilityai/stablelm-base-alpha-3b", asserted by
    # a public R torch GPT-NeoX test that builds the model from this config (see archs/README.md)
    "stablelm-base-alpha-3b": ("stabilityai/stablelm-base-alpha-3b", 3_637_321_728, False),
    # 134,515,008: the elements of the tensors in the GGUF file model=smollm2-135m is built from (size label 135M)
    "smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct", 134_515_008, True),
}


def build_on_meta(config):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def count_parameters(model) -> int:
    """Each tensor once: a tied head shares its storage with the token embedding."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def test_every_shipped_file_has_a_published_count():
    # the image models' sizes are checked in test_vision (against the ViT paper's and timm's counts)
    text = [p.stem for p in ARCHS.glob("*.json") if json.loads(p.read_text())["model_type"] not in ("vit", "dinov2")]
    assert sorted(text) == sorted(PUBLISHED)


def test_readme_names_every_file_and_hub_id():
    readme = (ARCHS / "README.md").read_text()
    for stem, (hub_id, _, _) in PUBLISHED.items():
        assert f"{stem}.json" in readme and hub_id in readme, stem


@pytest.mark.parametrize("stem", sorted(PUBLISHED))
def test_builds_on_meta_with_published_parameter_count(stem):
    hub_id, published, tied = PUBLISHED[stem]
    fields = json.loads((ARCHS / f"{stem}.json").read_text())
    config = AutoConfig.for_model(**fields)
    assert type(config).model_type == fields["model_type"]
    model = build_on_meta(config)
    assert type(model).__name__ == fields["architectures"][0]
    assert all(p.device.type == "meta" for p in model.parameters())
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    assert count_parameters(model) == published, hub_id


@pytest.mark.parametrize("stem", sorted(PUBLISHED))
def test_loads_as_a_config_json_folder(stem, tmp_path):
    """The same file read the way a downloaded checkpoint folder is: AutoConfig.from_pretrained(dir)."""
    shutil.copy(ARCHS / f"{stem}.json", tmp_path / "config.json")
    config = AutoConfig.from_pretrained(tmp_path)
    assert count_parameters(build_on_meta(config)) == PUBLISHED[stem][1]
