"""The job's keys against the layers its meta model shows (run/structure.found), in every mode: the module
names the config gives, LoRA's rank against the narrowest adapted layer, the attention kernel the model's class
supports, and on a CPU the 4-bit layers bitsandbytes' kernel can pack. Called by validate_model.check_model."""
from ..config.schema import Config, is_on
from ..errors import ConfigError


def check(job: Config, found) -> None:
    """Each check of the job against its model's layers, as check_model runs them."""
    _modules(job, found)
    _attention_kernel(job, found)
    _lora_rank(job, found)
    _four_bit_cpu_kernel(job, found)


def _named_modules(job: Config) -> list[tuple[str, list[str]]]:
    """(key, names) of every key that names modules of the model."""
    m, lora = job.model, job.lora
    named = [(f"model.{key}", list(getattr(m, key))) for key in ("attention_modules", "head_modules",
                                                                   "quantize_skip_modules") if getattr(m, key)]
    named += [(f"model.{key}", [getattr(m, key)]) for key in ("embeddings_module", "layers_module") if getattr(m, key)]
    if is_on(lora) and isinstance(lora.target_modules, (list, tuple)):
        named.append(("lora.target_modules", list(lora.target_modules)))
    return named


def _modules(job: Config, found) -> None:
    """Each module name the config gives is one of the model's, matched as peft and find_module match them."""
    for key, names in _named_modules(job):
        among = found.adaptable if key == "lora.target_modules" else found.modules
        for name in names:
            if not any(n == name or n.endswith("." + name) for n in among):
                leaves = ", ".join(dict.fromkeys(n.rpartition(".")[2] for n in found.adaptable))
                allowed = (f"all-linear, or names of its layers LoRA can adapt: {leaves} (null: "
                           f"{', '.join(found.structure.attention)})" if key == "lora.target_modules" else
                           f"module paths of the model, e.g. layers {found.structure.layers}, embeddings "
                           f"{', '.join(found.structure.embeddings)}, head {', '.join(found.structure.head)} (null: "
                           "found from the model)")
                raise ConfigError(key, f"{name!r} is not a module of model={job.model.name}; allowed: {allowed}")


def _lora_rank(job: Config, found) -> None:
    """lora.r within the narrowest layer LoRA adapts: an update B @ A of a (out x in) weight has rank at most
    min(out, in), so a larger r adds parameters and time and nothing the update can express."""
    if not is_on(job.lora):
        return
    targets = job.lora.target_modules
    names = (job.model.attention_modules or found.structure.attention) if targets is None else targets
    layers = found.structure.layers + "."
    widths = [(w, n) for n, w in zip(found.adaptable, found.widths, strict=True)
              if (n.startswith(layers) if names == "all-linear" else any(n == t or n.endswith("." + t) for t in names))]
    if widths and job.lora.r > min(widths)[0]:
        width, name = min(widths)
        raise ConfigError("lora.r", f"{job.lora.r} is above the rank the narrowest adapted layer allows ({name}: "
                                    f"{width} features); allowed: an integer from 1 to {width}")


def _attention_kernel(job: Config, found) -> None:
    """The attention implementation is one the model's class supports (transformers refuses the others as it
    builds the model: its `_supports_sdpa` / `_supports_flash_attn` flags)."""
    kernel = job.attention.implementation.value
    if kernel not in found.kernels:
        raise ConfigError("attention", f"{kernel} is not an attention implementation model={job.model.name} "
                                       f"({job.model.architecture or 'its config'}) supports; allowed: "
                                       f"{', '.join(sorted(found.kernels))}")


# bitsandbytes' 4-bit CPU kernel repacks each weight in blocks of 32 output rows and pairs of input columns
# (bitsandbytes/functional.py, _convert_weight_packed_for_cpu: "N must be divisible by block_n", "K must be even")
CPU_4BIT_BLOCK = 32


def _four_bit_cpu_kernel(job: Config, found) -> None:
    """On a CPU, each 4-bit layer has a shape bitsandbytes' CPU kernel can pack: out features a multiple of
    32, in features even. Checked on every CPU (the kernel packs where the CPU has AVX512-BF16), so a job is
    refused alike on every CPU."""
    import torch

    from ..config.choices import Device
    from ..techniques import lora

    on_cpu = job.hardware.device == Device.cpu or (job.hardware.device == Device.auto and not torch.cuda.is_available())
    if not on_cpu or lora.traits(job.lora).quantize != "nf4":
        return
    blocks = found.structure.layers + "."
    for layer in found.linears:
        if layer.name.startswith(blocks) and (layer.out_features % CPU_4BIT_BLOCK or layer.in_features % 2):
            raise ConfigError("lora.quantize", f"nf4 on a CPU needs every quantized layer's out features to be a "
                                               f"multiple of {CPU_4BIT_BLOCK} and its in features even (bitsandbytes' "
                                               f"4-bit CPU kernel); {layer.name} is {layer.in_features} -> "
                                               f"{layer.out_features}; allowed: model sizes that make it so, "
                                               "lora.quantize=int8, or a CUDA device")
