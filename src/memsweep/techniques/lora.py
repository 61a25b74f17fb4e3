"""lora: none | r8 | r16 | qlora (4-bit base + LoRA) | int8 (8-bit base + LoRA), through peft and bitsandbytes.

Targets: the attention's q/k/v projections found in the model (structure.py), a list of module names,
or `all-linear` (peft: every linear layer of the blocks, not the head). The head is trained in full.
A 4-bit base computes in the precision's compute dtype; over a 16-bit model peft keeps the adapters in fp32
unless `lora.autocast_adapter_dtype=false`.

Compute dtypes, double quantization and the adapters' dtype: docs/techniques/lora.md.
"""
from dataclasses import dataclass

from ..config.schema import Quantize, TaskName, is_on
from .quantize import audit, conv1d, quantize_blocks, require


@dataclass(frozen=True)
class Traits:
    rank: int  # 0 = no adapters
    quantize: str | None  # the base weights bitsandbytes stores: "nf4" (4-bit), "int8" (LLM.int8), None
    double_quant: bool = False  # NF4's block scales quantized again

    @property
    def on(self) -> bool:
        return self.rank > 0


def peft_task_type(name) -> str | None:
    """peft's task type: its wrapper for the head (none for an image classifier, whose batch peft passes on as
    it is)."""
    return {TaskName.causal_lm: "CAUSAL_LM", TaskName.classification: "SEQ_CLS"}.get(TaskName(name))


def new_head(name) -> bool:
    """Whether the task puts a new head on the model (a classifier, trained in full under LoRA); a causal LM's
    head is the model's own vocabulary projection."""
    return TaskName(name) != TaskName.causal_lm


def traits(cfg) -> Traits:
    on = is_on(cfg)
    quantize = cfg.quantize.value if on and cfg.quantize != Quantize.none else None
    return Traits(rank=cfg.r if on else 0, quantize=quantize, double_quant=bool(quantize == "nf4" and cfg.double_quant))


# the precision's compute dtype (precision.Traits.compute) as bitsandbytes' 4-bit compute dtype
COMPUTE_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


def quantization_config(t: Traits, skip_modules: list[str], compute: str):
    from transformers import BitsAndBytesConfig

    if t.quantize == Quantize.nf4.value:
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                  bnb_4bit_compute_dtype=COMPUTE_DTYPE.get(compute, "float32"),
                                  bnb_4bit_use_double_quant=t.double_quant, llm_int8_skip_modules=skip_modules)
    return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip_modules)


def wrap(model, cfg, structure, task: str):
    from peft import LoraConfig, get_peft_model

    targets = cfg.target_modules or list(structure.attention)
    # A causal LM's head is its vocabulary projection (often tied to the input embedding): it stays
    # frozen under LoRA, as peft's CAUSAL_LM task does; a classifier's head is new and is trained.
    head = [m.split(".")[-1] for m in structure.head] if new_head(task) else None
    task_type = peft_task_type(task)
    # GPT-2's Conv1D stores its weight (in, out): peft adapts it transposed (it would set this itself, warning)
    transposed = any(isinstance(m, conv1d()) for m in model.modules())
    config = LoraConfig(task_type=task_type, r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                        target_modules=targets if targets == "all-linear" else list(targets), modules_to_save=head,
                        fan_in_fan_out=transposed)
    return get_peft_model(model, config, autocast_adapter_dtype=cfg.autocast_adapter_dtype)


def apply(cfg, setup) -> None:
    t = traits(cfg)
    if not t.on:
        return
    structure, task = setup.structure, setup.task
    if t.quantize is not None:
        config = quantization_config(t, list(structure.quantize_skip), setup.techniques.precision.compute)
        setup.load_kwargs["quantization_config"] = config  # what transformers quantizes as it loads
        setup.model_transforms.append(lambda model: quantized_base(model, config, structure, t.quantize))
    setup.model_transforms.append(lambda model: wrap(model, cfg, structure, task))


def quantized_base(model, config, structure, asked: str):
    """The blocks' linear layers transformers' quantizer left (nn.Linear subclasses) quantized too, and the
    job refused as unsupported where the blocks are still mostly unquantized (techniques/quantize.py)."""
    quantize_blocks(model, config, structure.layers, structure.quantize_skip)
    require(audit(model, structure.layers), asked)
    return model
