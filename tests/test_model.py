"""Models: the embedded MiniLM and SmolLM2, the tiny test BERT, and the hub loading code on a local folder."""
import time

import pytest

from memsweep.config.schema import ModelConf, ModelSource
from memsweep.errors import ConfigError
from memsweep.run import model, packaged


def test_embedded_minilm_is_the_pretrained_22m_model():
    m = model.load_model(ModelConf(), num_labels=2, load_kwargs={})
    assert sum(p.numel() for p in m.parameters()) == pytest.approx(22.7e6, rel=0.01)
    assert m.config.num_hidden_layers == 6 and m.config.hidden_size == 384
    # pretrained: the word embeddings are not a fresh random init (std of a trained table differs)
    assert not (0.015 < m.bert.embeddings.word_embeddings.weight.std().item() < 0.025)


def test_tiny_is_built_from_the_config_keys():
    cfg = ModelConf(source=ModelSource.tiny, architecture="bert", hidden_size=64, num_layers=2, num_heads=2,
                    intermediate_size=128)
    m = model.load_model(cfg, num_labels=3, load_kwargs={})
    assert m.config.num_hidden_layers == 2 and m.classifier.out_features == 3


@pytest.mark.fast
def test_hub_code_loads_a_local_model_folder(tmp_path):
    tiny = model.load_model(ModelConf(source=ModelSource.tiny, architecture="bert", hidden_size=32, num_layers=1,
                                      num_heads=2, intermediate_size=64), num_labels=2, load_kwargs={})
    tiny.save_pretrained(tmp_path / "m")
    model.load_tokenizer(ModelConf()).save_pretrained(tmp_path / "m")
    cfg = ModelConf(source=ModelSource.hub, path=str(tmp_path / "m"))
    loaded = model.load_model(cfg, num_labels=2, load_kwargs={})  # through from_pretrained
    assert loaded.config.hidden_size == 32
    assert model.load_tokenizer(cfg).vocab_size == 30522


def test_unreachable_hub_model_fails_fast():
    started = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        model.load_model(ModelConf(source=ModelSource.hub, path="bert-base-uncased"), 2, {})
    assert time.perf_counter() - started < 5 and err.value.key == "model.path"


SMOLLM2 = ModelConf(name="smollm2-135m", source=ModelSource.embedded, config="smollm2-135m")


def test_an_embedded_model_not_built_yet_takes_its_shipped_architecture_and_builds_nothing(tmp_path, monkeypatch):
    # mode=estimate and the input checks read the architecture; only loading the weights builds the folder
    monkeypatch.setenv("MEMSWEEP_CACHE_DIR", str(tmp_path))
    assert packaged.folder("smollm2-135m", build=False) is None
    path, source = model.config_file(SMOLLM2)
    assert path.name == "smollm2-135m.json" and "shipped with memsweep" in source
    assert model.hf_config(SMOLLM2)[0].num_hidden_layers == 30
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError) as err:
        packaged.folder("nosuch")
    assert err.value.key == "model.name" and "smollm2-135m" in str(err.value)


@pytest.mark.slow  # builds the folder on a machine's first use (about a minute), then loads 538 MB
def test_smollm2_is_built_from_its_package_into_a_plain_pretrained_decoder():
    import torch
    from transformers import AutoModelForCausalLM

    m = model.load_model(SMOLLM2, num_labels=2, load_kwargs={"dtype": torch.float32}, auto_class=AutoModelForCausalLM)
    assert packaged.folder("smollm2-135m", build=False) is not None  # built once, kept in the cache
    assert type(m).__name__ == "LlamaForCausalLM" and getattr(m.config, "quantization_config", None) is None
    assert sum(p.numel() for p in m.parameters()) == 134_515_008  # the GGUF file's tensors, head tied
    assert m.lm_head.weight is m.model.embed_tokens.weight
    assert all(p.dtype == torch.float32 for p in m.parameters())
    tokenizer = model.load_tokenizer(SMOLLM2)
    assert len(tokenizer) == m.config.vocab_size == 49152 and tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False)
    assert chat.startswith("<|im_start|>system\n") and "<|im_start|>user\nHello<|im_end|>" in chat
    # pretrained: English prose is far likelier than under uniform logits (loss ln 49152 = 10.8)
    batch = tokenizer("The weather was lovely today, so we walked to the park and had a picnic by the lake.",
                      return_tensors="pt")
    with torch.no_grad():
        loss = m(**batch, labels=batch["input_ids"]).loss.item()
    assert loss < 4.5, loss


def test_a_tiny_models_checkpoint_folder_goes_when_its_process_ends():
    import subprocess
    import sys
    from pathlib import Path

    code = ("from memsweep.run import model; from memsweep.config.schema import ModelConf, ModelSource; "
            "m = model.load_model(ModelConf(source=ModelSource.tiny, architecture='bert', hidden_size=32, "
            "num_layers=1, num_heads=2, intermediate_size=64), num_labels=2, load_kwargs={}); "
            "print(next(iter(model._TINY_DIRS.values())))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    folder = Path(out.stdout.strip().splitlines()[-1])
    assert folder.name.startswith("memsweep-tiny-") and not folder.exists()
