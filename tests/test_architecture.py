"""Any architecture from its config: where the parts are (structure.py), the config and its overrides
(model.py), and one clear message for a model memsweep cannot size."""
import pytest
import torch

from conftest import compose_config
from memsweep.config.schema import ModelConf, ModelSource
from memsweep.errors import ConfigError
from memsweep.run import model, structure


def _meta(model_type: str, causal: bool, **keys):
    import transformers.initialization as hf_init
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    cls = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    with torch.device("meta"), hf_init.no_init_weights():
        return cls.from_config(AutoConfig.for_model(model_type, **keys))


@pytest.mark.parametrize("model_type,causal,embeddings,layers,head,attention", [
    ("bert", False, ("bert.embeddings",), "bert.encoder.layer", ("classifier",), ("query", "key", "value")),
    ("distilbert", False, ("distilbert.embeddings",), "distilbert.transformer.layer", ("pre_classifier", "classifier"),
     ("q_lin", "k_lin", "v_lin")),
    ("llama", True, ("model.embed_tokens",), "model.layers", ("lm_head",), ("q_proj", "k_proj", "v_proj")),
    ("qwen2", True, ("model.embed_tokens",), "model.layers", ("lm_head",), ("q_proj", "k_proj", "v_proj")),
    ("mistral", False, ("model.embed_tokens",), "model.layers", ("score",), ("q_proj", "k_proj", "v_proj")),
    ("gpt2", True, ("transformer.wte", "transformer.wpe"), "transformer.h", ("lm_head",), ("c_attn",)),
])
def test_the_parts_are_found_from_the_model(model_type, causal, embeddings, layers, head, attention):
    m = _meta(model_type, causal, num_hidden_layers=2)
    found = structure.discover(m)
    assert (found.embeddings, found.layers, found.head, found.attention) == (embeddings, layers, head, attention)
    blocks = m.get_submodule(found.layers)
    assert len(blocks) == 2 and type(blocks[0]).__name__ in m._no_split_modules | {"TransformerBlock"}
    # quantization keeps everything outside the blocks: the head (and BERT's pooler)
    assert set(head) <= set(found.quantize_skip) and not any(n.startswith(layers + ".") for n in found.quantize_skip)


def test_the_model_keys_override_what_is_found():
    job = compose_config(["model=tiny-llama", "task=causal_lm", "model.attention_modules=[q_proj,o_proj]",
                          "model.head_modules=[lm_head,model.norm]"])
    from omegaconf import OmegaConf

    found = structure.of_job(OmegaConf.to_object(job))
    assert found.attention == ("q_proj", "o_proj") and found.head == ("lm_head", "model.norm")
    assert found.layers == "model.layers"  # the keys left null are still found


def test_a_tiny_decoder_is_built_from_its_keys_and_a_shipped_config_takes_overrides():
    tiny, source = model.hf_config(ModelConf(name="t", source=ModelSource.tiny, architecture="llama", hidden_size=64,
                                             num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128))
    assert (tiny.model_type, tiny.num_key_value_heads, tiny.head_dim, source) == ("llama", 2, 16, "model config keys")
    # a shipped hub config with fewer layers: derived per-layer keys (Qwen2's layer_types) follow
    qwen, source = model.hf_config(ModelConf(name="q", source=ModelSource.hub, path="Qwen/Qwen2.5-0.5B",
                                             config="qwen2.5-0.5b", num_layers=3))
    assert qwen.num_hidden_layers == 3 and len(qwen.layer_types) == 3 and "shipped with memsweep" in source
    assert qwen.hidden_size == 896 and qwen.num_key_value_heads == 2 and qwen.tie_word_embeddings


@pytest.mark.parametrize("cfg,key,says", [
    (ModelConf(name="x", source=ModelSource.hub, path="nobody/nothing", config="nosuch"), "model.config",
     "llama-3.1-8b"),
    (ModelConf(name="x", source=ModelSource.hub, path="nobody/nothing"), "model.config", "qwen2.5-7b"),
    (ModelConf(name="x", source=ModelSource.tiny, architecture="nosuchmodel"), "model.architecture", "llama"),
])
def test_a_model_that_cannot_be_sized_is_one_clear_message(cfg, key, says):
    with pytest.raises(ConfigError) as err:
        model.hf_config(cfg)
    assert err.value.key == key and says in str(err.value)


def test_the_estimate_counts_a_tied_head_once():
    from omegaconf import OmegaConf

    from memsweep.config import hardware
    from memsweep.estimate import core

    job = OmegaConf.to_object(compose_config(["model=llama-3.2-1b", "task=causal_lm", "hardware=a100_40gb",
                                              "batch_size=1", "max_seq_len=16"]))
    assert core.estimate_job(job, hardware.detect(job.hardware)).total_params == 1_235_814_400  # as published
