"""The model of a job from its architecture alone: its transformers config (the real config.json where it
is on disk, else the model config's architecture keys) and the job's model class built from it on the
meta device, with the plan's transforms. No weights, no memory."""
import torch

from ..errors import ConfigError
from ..schema import Config, ModelConf, ModelSource


def num_labels(job: Config) -> int:
    # The real job counts the labels in its data; without the data, the config's label list (or a
    # binary task). The head is 2 x hidden values per label: negligible either way.
    return len(job.data.labels) if job.data.labels else 2


def model_config(cfg: ModelConf, labels: int):
    """(transformers config, where it came from). The real config.json where it is on disk (embedded
    model, local folder, Hugging Face cache); else the architecture keys of the model config."""
    from transformers import AutoConfig

    from ..model import dropout_kwargs, embedded_minilm_path, tiny_config

    if cfg.source == ModelSource.tiny:
        return tiny_config(cfg, labels), "model config keys"
    folder = (cfg.path or embedded_minilm_path()) if cfg.source == ModelSource.embedded else cfg.path
    if folder:
        try:
            config = AutoConfig.from_pretrained(folder, num_labels=labels, local_files_only=True, **dropout_kwargs(cfg))
            return config, f"config.json of {folder}"
        except (OSError, ValueError):
            pass  # not on disk: size it from the keys
    return architecture_config(cfg, labels), "model config keys"


def architecture_config(cfg: ModelConf, labels: int):
    from transformers import DistilBertConfig

    from ..model import dropout_kwargs, tiny_config

    if cfg.architecture == "bert":
        return tiny_config(cfg, labels)
    if cfg.architecture == "distilbert":
        return DistilBertConfig(vocab_size=cfg.vocab_size, dim=cfg.hidden_size, n_layers=cfg.num_layers,
                                n_heads=cfg.num_heads, hidden_dim=cfg.intermediate_size,
                                max_position_embeddings=cfg.max_position_embeddings, num_labels=labels,
                                **dropout_kwargs(cfg))
    raise ConfigError("model.architecture", f"{cfg.architecture!r}: the estimator can size bert and distilbert "
                                            "from their keys; for others give model.path a folder with config.json")


def meta_model(job: Config, plan, config):
    """The job's model class built from its config on the meta device (no memory, no weights, no
    init), with the plan's transforms: freezing, LoRA, checkpointing, bf16_true."""
    import transformers.initialization as hf_init
    from transformers import AutoModelForSequenceClassification

    kwargs = {k: plan.load_kwargs[k] for k in ("attn_implementation", "dtype") if k in plan.load_kwargs}
    with torch.device("meta"), hf_init.no_init_weights():
        return plan.transform(AutoModelForSequenceClassification.from_config(config, **kwargs))
