"""Where a model's parts are, found from the model itself: what freezing, LoRA, FSDP and quantization act on.

Any transformers architecture, no per-architecture table: the blocks (the `nn.ModuleList` of the class in
`_no_split_modules`), the embeddings, the head, the attention's query/key/value projections (LoRA's default
targets) and the linear layers kept in full precision under a quantized base. `model.*_module(s)` keys
override any of them.

How each part is found: docs/guide/running.md.
"""
import re
from dataclasses import dataclass
from typing import NamedTuple

from torch import nn

OUTPUT_PROJECTION = re.compile(r"(^|\.)(o_proj|out_proj|c_proj|out_lin|dense|wo|o)$|(^|\.)output(\.|$)")


@dataclass(frozen=True)
class Structure:
    embeddings: tuple[str, ...]
    layers: str  # the ModuleList of transformer blocks
    head: tuple[str, ...]
    attention: tuple[str, ...]  # LoRA's default targets (module names, matched as suffixes by peft)
    quantize_skip: tuple[str, ...]


def _is_linear(module) -> bool:
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layer

    return isinstance(module, (nn.Linear, Conv1D))


def _blocks(model) -> str:
    no_split = set(getattr(model, "_no_split_modules", None) or ())
    lists = [(name, m) for name, m in model.named_modules()
             if isinstance(m, nn.ModuleList) and len(m) and len({type(x) for x in m}) == 1]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no list of transformer blocks")
    named = [(name, m) for name, m in lists if type(m[0]).__name__ in no_split]
    return max(named or lists, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))[0]


def _embeddings(model, layers: str) -> tuple[str, ...]:
    modules = dict(model.named_modules())
    table = model.get_input_embeddings()
    name = next(n for n, m in modules.items() if m is table)
    parent = name.rpartition(".")[0]
    if parent and type(modules[parent]).__name__.endswith("Embeddings"):
        return (parent,)
    return tuple(n for n, m in modules.items() if isinstance(m, nn.Embedding) and not n.startswith(layers + "."))


def _attention(block) -> tuple[str, ...]:
    for name, module in block.named_modules():
        if re.search(r"attn|attention", name.rpartition(".")[2], re.I):
            inputs = [n for n, m in module.named_modules() if n and _is_linear(m) and not OUTPUT_PROJECTION.search(n)]
            if inputs:
                return tuple(dict.fromkeys(n.rpartition(".")[2] for n in inputs))
    return ()


def discover(model) -> Structure:
    """The structure of a transformers model (not peft-wrapped)."""
    layers = _blocks(model)
    backbone = getattr(model, "base_model_prefix", "")
    return Structure(
        embeddings=_embeddings(model, layers),
        layers=layers,
        head=tuple(n for n, m in model.named_children() if n != backbone and any(True for _ in m.parameters())),
        attention=_attention(model.get_submodule(layers)[0]),
        quantize_skip=tuple(n for n, m in model.named_modules() if _is_linear(m) and not n.startswith(layers + ".")),
    )


def with_overrides(found: Structure, o) -> Structure:
    """`found` with the paths a schema.ModelConf sets (null keeps what was found)."""
    return Structure(
        embeddings=(o.embeddings_module,) if o.embeddings_module else found.embeddings,
        layers=o.layers_module or found.layers,
        head=tuple(o.head_modules) if o.head_modules is not None else found.head,
        attention=tuple(o.attention_modules) if o.attention_modules is not None else found.attention,
        quantize_skip=tuple(o.quantize_skip_modules) if o.quantize_skip_modules is not None else found.quantize_skip,
    )


@dataclass(frozen=True)
class Found:
    """What the meta model shows of a job's model, kept per architecture for the next job."""
    structure: Structure
    modules: tuple[str, ...]  # every module's dotted name
    adaptable: tuple[str, ...]  # the layers LoRA can adapt: linear, embedding, convolution
    parameters: int
    # each adaptable layer's narrower side (min of its weight's first two dims): the most rank a LoRA update has
    widths: tuple[int, ...] = ()
    linears: tuple["Linear", ...] = ()  # every linear layer, with its (out, in) features
    kernels: frozenset[str] = frozenset({"eager"})  # the attention implementations the model's class supports


class Linear(NamedTuple):
    name: str
    out_features: int
    in_features: int


# transformers' flags on a model class for each attention implementation it supports (eager: every model)
KERNEL_FLAGS = {"sdpa": "_supports_sdpa", "flash_attention_2": "_supports_flash_attn"}


def _linear(name: str, module) -> Linear:
    rows, columns = module.weight.shape[:2]
    return Linear(name, columns, rows) if not isinstance(module, nn.Linear) else Linear(name, rows, columns)


_FOUND: dict[int, Found] = {}


def _is_adaptable(module) -> bool:
    return _is_linear(module) or isinstance(module, (nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d))


def found(job) -> Found:
    """What the job's meta model (model.meta_model: built once per architecture and head, no weights, no
    memory) shows, read once."""
    from .model import meta_model
    from .task import auto_class, num_labels

    model = meta_model(job.model, auto_class(job.task), num_labels(job.task, job.data.labels))
    if id(model) not in _FOUND:  # meta models are kept for the process: the id stays theirs
        names = tuple(n for n, _ in model.named_modules() if n)
        adaptable = [(n, m) for n, m in model.named_modules() if _is_adaptable(m)]
        _FOUND[id(model)] = Found(discover(model), names, tuple(n for n, _ in adaptable),
                                  sum(p.numel() for p in model.parameters()),
                                  tuple(min(m.weight.shape[:2]) for _, m in adaptable),
                                  tuple(_linear(n, m) for n, m in model.named_modules() if _is_linear(m)),
                                  frozenset({"eager"} | {k for k, flag in KERNEL_FLAGS.items()
                                                         if getattr(type(model), flag, False)}))
    return _FOUND[id(model)]


def of_job(job) -> Structure:
    """The structure of a job's model, read off the model built on the meta device (no weights, no memory)."""
    return with_overrides(found(job).structure, job.model)
