"""lora: none | r8 | r16 | qlora (4-bit base + LoRA) | int8 (8-bit base + LoRA), through peft and bitsandbytes."""
from ..schema import Quantize


def quantization_config(quantize: Quantize, skip_modules: list[str]):
    from transformers import BitsAndBytesConfig

    if quantize == Quantize.nf4:
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="float32",
                                  llm_int8_skip_modules=skip_modules)
    return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip_modules)


def wrap(model, cfg, structure):
    from peft import LoraConfig, TaskType, get_peft_model

    head = [m.split(".")[-1] for m in structure.head]
    config = LoraConfig(task_type=TaskType.SEQ_CLS, r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                        target_modules=list(cfg.target_modules or structure.attention),
                        modules_to_save=head)
    return get_peft_model(model, config)


def apply(cfg, plan) -> None:
    if not cfg.enabled:
        return
    structure = plan.structure
    if cfg.quantize != Quantize.none:
        plan.load_kwargs["quantization_config"] = quantization_config(cfg.quantize, list(structure.quantize_skip))
    plan.model_transforms.append(lambda model: wrap(model, cfg, structure))
