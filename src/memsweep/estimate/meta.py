"""The model a trace runs: a copy of the job's meta model (run/model.meta_model: built once per
architecture and head from its config, no weights, no memory; the structure is read off the same one)
with the setup's load-time settings and transforms: the stored dtype, the attention kernel,
bitsandbytes' layers where the setup quantizes, then freezing, LoRA, checkpointing, the stored dtype (bf16_true,
fp16_true, fp64).
"""
import copy

from ..config.schema import Config
from ..run.model import hf_config, meta_model
from ..run.task import auto_class, num_labels


def model_config(job: Config):
    """(the job's transformers config, where it came from)."""
    return hf_config(job.model, num_labels(job.task, job.data.labels))


def traced_model(job: Config, setup):
    """A fresh copy of the job's meta model, loaded as the setup loads the real one and transformed."""
    model = copy.deepcopy(meta_model(job.model, auto_class(job.task), num_labels(job.task, job.data.labels)))
    if (dtype := setup.load_kwargs.get("dtype")) is not None:
        model.to(dtype)
    if (attention := setup.load_kwargs.get("attn_implementation")) is not None:
        model.set_attn_implementation(attention)
    if (quantization := setup.load_kwargs.get("quantization_config")) is not None:
        bitsandbytes_layers(model, quantization)
    return setup.transform(model)


def bitsandbytes_layers(model, quantization_config) -> None:
    """Swap the linear layers for bitsandbytes' with transformers' own quantizer, as from_pretrained does
    before it loads the weights (so peft then wraps them in its bitsandbytes LoRA layers; the trace
    quantizes their weights, fake.quantize_bitsandbytes)."""
    from transformers.quantizers import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(quantization_config, pre_quantized=False)
    quantizer.preprocess_model(model, device_map=None)
    quantizer.postprocess_model(model)  # is_loaded_in_4bit / _8bit: what peft dispatches on
