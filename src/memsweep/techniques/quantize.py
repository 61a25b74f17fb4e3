"""The lora group's quantized base (`lora.quantize=nf4 | int8`): every linear layer of the blocks as a
bitsandbytes layer, in the real model and in the estimate's meta model alike, and the audit that says what was.

transformers' quantizer replaces only layers whose type is exactly `nn.Linear` (and GPT-2's Conv1D):
`replace_with_bnb_linear` in transformers/integrations/bitsandbytes.py tests `type(module) is nn.Linear`, so a
subclass (Falcon's FalconLinear, its fused query_key_value among them) stays in 16 or 32 bits.
`quantize_blocks` replaces what it left, with the quantization config's own settings, after loading (the
real weights are quantized as bitsandbytes quantizes them when they move to a device, Params4bit.to /
Int8Params.to) or on the meta device (the trace quantizes them on fake tensors). `audit` counts the blocks'
weight matrices both ways; `require` ends a job that asked for a quantized base and got less.

Why a job ends unsupported rather than training unquantized: docs/techniques/lora.md.
"""
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import Unsupported
from .modules import find_module

# The share of the blocks' weights (by elements) a job asking for a quantized base must have quantized: under
# it, the job would train a different model than asked (mostly 16- or 32-bit weights), so it ends unsupported.
LEAST_SHARE = 0.5


def conv1d():
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layer: its weight is (in, out)

    return Conv1D


def _bitsandbytes_layers() -> tuple[type, ...]:
    import bitsandbytes as bnb

    return bnb.nn.Linear4bit, bnb.nn.Linear8bitLt


def is_linear(module) -> bool:
    """A linear layer of any class: nn.Linear and its subclasses (bitsandbytes' layers are ones), or Conv1D."""
    return isinstance(module, (nn.Linear, conv1d()))


def _weight(linear) -> torch.Tensor:
    """The (out, in) weight of a linear layer."""
    weight = linear.weight.data
    return weight.t().contiguous() if isinstance(linear, conv1d()) else weight


def _bitsandbytes_linear(linear, config) -> nn.Module:
    """`linear` as the bitsandbytes layer transformers' quantizer makes from `config` (a BitsAndBytesConfig),
    its weight quantized where it is not on the meta device."""
    import bitsandbytes as bnb

    weight = _weight(linear)
    out_features, in_features = weight.shape
    bias = linear.bias is not None
    with torch.device("meta"):
        if config.quantization_method() == "llm_int8":
            new = bnb.nn.Linear8bitLt(in_features, out_features, bias, has_fp16_weights=config.llm_int8_has_fp16_weight,
                                      threshold=config.llm_int8_threshold)
        else:
            new = bnb.nn.Linear4bit(in_features, out_features, bias, config.bnb_4bit_compute_dtype,
                                    compress_statistics=config.bnb_4bit_use_double_quant,
                                    quant_type=config.bnb_4bit_quant_type,
                                    quant_storage=config.bnb_4bit_quant_storage)
    settings = {k: v for k, v in vars(new.weight).items() if k != "module"}
    new.weight = type(new.weight)(weight, requires_grad=False, **settings)
    if isinstance(new, bnb.nn.Linear4bit):
        new.weight.module = new
    if bias:
        new.bias = nn.Parameter(linear.bias.data, requires_grad=linear.bias.requires_grad)
    if weight.device.type != "meta":
        new.weight = new.weight.to(weight.device)  # bitsandbytes quantizes a weight as it moves to a device
    return new


def quantize_blocks(model, config, layers: str, skip: tuple[str, ...] = ()):
    """Every linear layer of the blocks (`layers`, the ModuleList's dotted name) that is not yet a bitsandbytes
    layer, replaced by one made from `config`, except those `skip` names (transformers' own matching of
    llm_int8_skip_modules). The model, for a chain of transforms."""
    from transformers.quantizers.quantizers_utils import should_convert_module

    blocks = find_module(model, layers)
    quantized = _bitsandbytes_layers()
    left = [(name, m) for name, m in blocks.named_modules()
            if is_linear(m) and not isinstance(m, quantized) and should_convert_module(f"{layers}.{name}", list(skip))]
    for name, linear in left:
        parent, _, attribute = name.rpartition(".")
        setattr(blocks.get_submodule(parent), attribute, _bitsandbytes_linear(linear, config))
    return model


@dataclass(frozen=True)
class Audit:
    """The blocks' weight matrices (every parameter of two or more dimensions but LoRA's adapters), quantized
    (a bitsandbytes layer's weight) and not: how many, their elements and the bytes they are stored in."""
    quantized: int
    quantized_params: int
    quantized_bytes: int
    unquantized: int
    unquantized_params: int
    unquantized_bytes: int
    example: str | None = None  # the largest unquantized weight's name, for the message

    @property
    def share(self) -> float:
        """The quantized share of the blocks' weight elements."""
        total = self.quantized_params + self.unquantized_params
        return self.quantized_params / total if total else 0.0


def stored_bytes(layer) -> int:
    """The bytes a bitsandbytes layer's weight is stored in once quantized (on the meta device it is not yet):
    two 4-bit values a byte, or one int8 (the block scales, QuantState, are not counted)."""
    import bitsandbytes as bnb

    elements = layer.in_features * layer.out_features
    return -(-elements // 2) if isinstance(layer, bnb.nn.Linear4bit) else elements


def audit(model, layers: str) -> Audit:
    """What the blocks of `model` (peft-wrapped or not) hold, read off the model."""
    blocks = find_module(model, layers)
    quantized = [m for m in blocks.modules() if isinstance(m, _bitsandbytes_layers())]
    done = {id(m.weight) for m in quantized}
    others = {f"{layers}.{name}": p for name, p in blocks.named_parameters()
              if p.dim() >= 2 and id(p) not in done and ".lora_" not in f".{name}"}
    return Audit(quantized=len(quantized), quantized_params=sum(m.in_features * m.out_features for m in quantized),
                 quantized_bytes=sum(stored_bytes(m) for m in quantized),
                 unquantized=len(others), unquantized_params=sum(p.numel() for p in others.values()),
                 unquantized_bytes=sum(p.numel() * p.element_size() for p in others.values()),
                 example=max(others, key=lambda name: others[name].numel(), default=None))


def require(found: Audit, asked: str) -> None:
    """A job that asked for a quantized base (`lora.quantize`) and got under LEAST_SHARE of it ends unsupported."""
    if found.share < LEAST_SHARE:
        raise Unsupported(f"lora.quantize={asked}: {found.share:.0%} of the blocks' weights quantized "
                          f"({found.quantized} bitsandbytes layers; {found.unquantized} weights of "
                          f"{found.unquantized_params:,} elements are not linear layers bitsandbytes can replace, "
                          f"e.g. {found.example}); at least {LEAST_SHARE:.0%} is needed to train the job asked")
