"""The model of a job from its architecture alone: its transformers config (model.hf_config: the real
config.json where it is on disk, else the one shipped with memsweep or the architecture keys) and the
job's model class (its task's) built from it on the meta device, with the plan's transforms. No
weights, no memory."""
import torch

from ..config.schema import Config
from ..run.task import auto_class, labelled


def num_labels(job: Config) -> int:
    # The real job counts the labels in its data; without the data, the config's label list (or a
    # binary task). The head is 2 x hidden values per label: negligible either way.
    return len(job.data.labels) if job.data.labels and labelled(job.task) else 2


def model_config(job: Config):
    """(transformers config, where it came from)."""
    from ..run.model import hf_config

    config, source = hf_config(job.model, num_labels(job))
    if getattr(config, "pad_token_id", None) is None:  # a decoder classifier finds the last token by it
        config.pad_token_id = 0
    return config, source


def meta_model(job: Config, plan, config, quantized: bool = False):
    """The job's model class built from its config on the meta device (no memory, no weights, no
    init), with the plan's transforms: freezing, LoRA, checkpointing, bf16_true. `quantized`: with the
    job's bitsandbytes layers in place of its linear ones (the trace quantizes their weights); else the
    layers stay nn.Linear and the inventory counts their quantized bytes."""
    import transformers.initialization as hf_init

    kwargs = {k: plan.load_kwargs[k] for k in ("attn_implementation", "dtype") if k in plan.load_kwargs}
    with torch.device("meta"), hf_init.no_init_weights():
        model = auto_class(job.task).from_config(config, **kwargs)
        model.tie_weights()  # skipped with the init under no_init_weights: a tied head is one tensor
        if quantized and "quantization_config" in plan.load_kwargs:
            bitsandbytes_layers(model, plan.load_kwargs["quantization_config"])
        return plan.transform(model)


def bitsandbytes_layers(model, quantization_config) -> None:
    """Swap the linear layers for bitsandbytes' with transformers' own quantizer, as from_pretrained does
    before it loads the weights (so peft then wraps them in its bitsandbytes LoRA layers)."""
    from transformers.quantizers import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(quantization_config, pre_quantized=False)
    quantizer.preprocess_model(model, device_map=None)
    quantizer.postprocess_model(model)  # is_loaded_in_4bit / _8bit: what peft dispatches on
