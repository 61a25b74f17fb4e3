"""The model of a job from its architecture alone: its transformers config (model.hf_config: the real
config.json where it is on disk, else the one shipped with memsweep or the architecture keys) and the
job's model class (its task's) built from it on the meta device, with the plan's transforms. No
weights, no memory."""
import torch

from ..schema import Config
from ..task import auto_class, labelled


def num_labels(job: Config) -> int:
    # The real job counts the labels in its data; without the data, the config's label list (or a
    # binary task). The head is 2 x hidden values per label: negligible either way.
    return len(job.data.labels) if job.data.labels and labelled(job.task) else 2


def model_config(job: Config):
    """(transformers config, where it came from)."""
    from ..model import hf_config

    config, source = hf_config(job.model, num_labels(job))
    if getattr(config, "pad_token_id", None) is None:  # a decoder classifier finds the last token by it
        config.pad_token_id = 0
    return config, source


def meta_model(job: Config, plan, config):
    """The job's model class built from its config on the meta device (no memory, no weights, no
    init), with the plan's transforms: freezing, LoRA, checkpointing, bf16_true."""
    import transformers.initialization as hf_init

    kwargs = {k: plan.load_kwargs[k] for k in ("attn_implementation", "dtype") if k in plan.load_kwargs}
    with torch.device("meta"), hf_init.no_init_weights():
        model = auto_class(job.task).from_config(config, **kwargs)
        model.tie_weights()  # skipped with the init under no_init_weights: a tied head is one tensor
        return plan.transform(model)
