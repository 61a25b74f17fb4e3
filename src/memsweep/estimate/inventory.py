"""The parameter inventory the closed form counts: every parameter of the job's model built on the meta
device with the plan's transforms (exact counts, dtypes, what is frozen, LoRA or quantized)."""
import math
from dataclasses import dataclass
from typing import Optional

from ..config.schema import Config, is_on


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    elem: int  # bytes per value of its dtype
    nbytes: int  # as stored (a quantized weight counts its packed bytes and block scales)
    trainable: bool
    embedding: bool  # weight of an nn.Embedding (Trainer keeps bitsandbytes state 32-bit for those)
    decay: bool  # in Trainer's weight-decay parameter group
    layer: Optional[int]  # encoder layer index, None outside the layers

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Inventory:
    params: list[Tensor]
    buffers_bytes: int
    linear_weights_per_layer: int  # values of the nn.Linear weights of one encoder layer
    head_linear_weights: int  # values of the head's nn.Linear weights (pooler / pre_classifier, classifier)
    # The same, trainable only: autocast caches its 16-bit casts of leaf tensors that require grad,
    # so frozen weights (LoRA's base, a frozen encoder) are cast again at each use and freed
    trainable_linear_weights_per_layer: int
    trainable_head_linear_weights: int
    trainable_layers: list[bool]  # per encoder layer: holds a trainable parameter
    embeddings_trainable: bool
    lora_rank: int  # 0 = no LoRA
    lora_modules_per_layer: int
    tied_head: bool = False  # the head's projection is the input embedding's weight (a tied LM head)


def _layer_index(name: str, layers_module: str) -> Optional[int]:
    prefix = layers_module.split(".")[-1] + "."
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == prefix[:-1] and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def inventory(model, job: Config, structure) -> Inventory:
    """The parameter inventory of a model built on the meta device (see estimate.meta_model); `structure`
    (structure.py) says where its blocks, embeddings and full-precision modules are."""
    import torch
    from transformers import Trainer
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layer

    decay = set(Trainer.get_decay_parameter_names(None, model))  # Trainer's own grouping; `self` unused
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    quantize = job.lora.quantize.value if is_on(job.lora) else "none"
    skip = list(structure.quantize_skip)
    layers_module = structure.layers
    # bitsandbytes replaces linear layers only: an embedding's 2-D weight stays as it is
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, (torch.nn.Linear, Conv1D))}
    params, seen = [], set()
    layers = None
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        layer = _layer_index(name, layers_module)
        if layer is not None:
            layers = max(layers or 0, layer + 1)
        nbytes = p.numel() * p.element_size()
        # (a head tied to the input embedding is the embedding's weight: it stays as it is too)
        if quantize != "none" and id(p) in linear_weights and id(p) not in embeddings and _quantized(name, p, skip):
            nbytes = quantized_bytes(p, quantize)
        params.append(Tensor(name, tuple(p.shape), p.element_size(), nbytes, p.requires_grad, id(p) in embeddings,
                             name in decay, layer))
    layers = layers or 0
    trainable_layers = [any(t.trainable for t in params if t.layer == i) for i in range(layers)]
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))
               and "lora_" not in n and "modules_to_save" not in n]
    layer0 = [m.weight for n, m in linears if _layer_index(n + ".weight", layers_module) == 0]
    head = [m.weight for n, m in linears if _layer_index(n + ".weight", layers_module) is None]
    lora_modules = [n for n, m in model.named_modules() if n.endswith("lora_A") and len(list(m.children()))]
    lora_in_layer0 = [n for n in lora_modules if _layer_index(n + ".x", layers_module) == 0]
    return Inventory(
        params=params,
        buffers_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        linear_weights_per_layer=sum(w.numel() for w in layer0),
        head_linear_weights=sum(w.numel() for w in head),
        trainable_linear_weights_per_layer=sum(w.numel() for w in layer0 if w.requires_grad),
        trainable_head_linear_weights=sum(w.numel() for w in head if w.requires_grad),
        trainable_layers=trainable_layers,
        embeddings_trainable=any(t.trainable for t in params if t.layer is None and _under(t.name, structure.embeddings)),
        lora_rank=job.lora.r if is_on(job.lora) else 0,
        lora_modules_per_layer=len(lora_in_layer0),
        tied_head=any(id(w) in embeddings for w in head),
    )


def _under(name: str, modules) -> bool:
    name = name.replace("base_model.model.", "")
    return any(name.startswith(m + ".") for m in modules)


def _quantized(name: str, p, skip: list[str]) -> bool:
    """bitsandbytes quantizes the 2-D Linear weights outside the skip modules and the adapters."""
    module = name.rsplit(".", 1)[0]
    if p.dim() != 2 or "lora_" in name or "modules_to_save" in name or "embeddings" in name:
        return False
    base = module.replace("base_model.model.", "").replace(".base_layer", "")
    return not any(base.startswith(s) or base.endswith(s) for s in skip)


def quantized_bytes(p, quantize: str) -> int:
    if quantize == "nf4":  # 4 bits per value, one fp32 absmax per 64-value block
        return p.numel() // 2 + math.ceil(p.numel() / 64) * 4
    return p.numel() + p.shape[0] * 4  # int8: 1 byte per value, one fp32 scale per output row


def layer_flops(inv: Inventory, micro_batch: int, seq_len: int, attention_width: int, recompute: bool) -> int:
    """Matmul FLOPs of the blocks for one micro-batch's forward and backward (2 per multiply-add): every
    linear weight of a block on every token, and attention's q @ k^T and probabilities @ v over
    `attention_width` values per token; with `recompute` (checkpointing) a block's forward runs twice."""
    T = micro_batch * seq_len
    linear = 2 * T * inv.linear_weights_per_layer
    attention = 2 * 2 * micro_batch * seq_len * seq_len * attention_width
    trains_weights = not inv.lora_rank
    total, upstream = 0, inv.embeddings_trainable
    for layer_trains in inv.trainable_layers:
        recording = upstream or layer_trains
        total += linear + attention
        if recording:
            # gradients of the inputs (unless nothing below needs them) and of trainable weights;
            # attention has no weights: two matmuls back for each forward one
            total += linear * ((1 if upstream else 0) + (1 if trains_weights and layer_trains else 0)) + 2 * attention
            if recompute:
                total += linear + attention
        upstream = recording
    return total
