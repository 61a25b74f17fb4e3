"""Models: the embedded MiniLM, the tiny test BERT, and the hub loading code on a local folder."""
import time

import pytest

from memsweep.run import model
from memsweep.errors import ConfigError
from memsweep.config.schema import ModelConf, ModelSource


def test_embedded_minilm_is_the_pretrained_22m_model():
    m = model.load_model(ModelConf(), num_labels=2, load_kwargs={})
    assert sum(p.numel() for p in m.parameters()) == pytest.approx(22.7e6, rel=0.01)
    assert m.config.num_hidden_layers == 6 and m.config.hidden_size == 384
    # pretrained: the word embeddings are not a fresh random init (std of a trained table differs)
    assert not (0.015 < m.bert.embeddings.word_embeddings.weight.std().item() < 0.025)


def test_tiny_is_built_from_the_config_keys():
    cfg = ModelConf(source=ModelSource.tiny, architecture="bert", hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    m = model.load_model(cfg, num_labels=3, load_kwargs={})
    assert m.config.num_hidden_layers == 2 and m.classifier.out_features == 3


def test_hub_code_loads_a_local_model_folder(tmp_path):
    tiny = model.load_model(ModelConf(source=ModelSource.tiny, architecture="bert", hidden_size=32, num_layers=1, num_heads=2,
                                      intermediate_size=64), num_labels=2, load_kwargs={})
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
