"""This CPU's peak rates, measured once per process: what the roofline (estimate/roofline.py) times a CPU
step at, as `make bench` measures its matmul ceiling (benchmarks/hw_efficiency.py): a large square
`torch.mm` per dtype, a large copy for memory bandwidth, dropout's random draws (`bernoulli_`), and what
an op costs beyond its work (a tiny model's step; a call from a Python loop). Measured at the thread count
torch runs with, so a prediction and a job of the same process compare like with like."""
import functools
import itertools
import statistics
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .host_memory import PAGE  # what a fresh page is (glibc's malloc)


class TensorSpec(NamedTuple):
    """A tensor operand as this CPU can make it again (product_s below makes one of it)."""
    kind: str  # "tensor": an operand's value is a TensorSpec or a plain scalar, string or None
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str  # torch's name of its dtype, without "torch." ("bfloat16")


class Operand(NamedTuple):
    """One argument of a timed op: `name` None for a positional one, its keyword otherwise."""
    name: str | None
    value: TensorSpec | int | float | bool | str | None


def median_seconds(run, seconds: float, sync=lambda: None, warm: int = 2, least: int = 5,
                   most: float = float("inf"), before=lambda: None) -> float:
    """Median seconds of a call of `run` over about `seconds` of calls (at least `least`, at most `most`), after
    `warm` calls that are not counted; `sync` waits for the device after each (torch.cuda.synchronize where the
    work runs on a GPU); `before` runs ahead of each call, untimed (a cache sweep)."""
    for _ in range(warm):
        before()
        run()
    sync()
    took, spent = [], 0.0
    while len(took) < least or (spent < seconds and len(took) < most):
        before()
        start = time.perf_counter()
        run()
        sync()
        took.append(time.perf_counter() - start)
        spent += took[-1]
    return statistics.median(took)


def median_rate(run, work: float, seconds: float, sync=lambda: None) -> float:
    """`work` (FLOPs, bytes, draws) per second of a median call of `run` (median_seconds)."""
    return work / median_seconds(run, seconds, sync)


def matmul_flops(dtype: torch.dtype, n: int = 1024, seconds: float = 0.5) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return median_rate(lambda: torch.mm(a, b), 2 * n ** 3, seconds)


def copy_bytes_s(numel: int = 2 ** 24, seconds: float = 0.5) -> float:
    """Bytes read plus written per second by a copy far larger than the caches (64 MiB each way)."""
    src, dst = torch.randn(numel), torch.empty(numel)
    return median_rate(lambda: dst.copy_(src), 2 * numel * 4, seconds)


def launches(func) -> bool:
    """Whether an ATen op runs work of its own, as the roofline counts ops (estimate/roofline.py): not a view or a
    creation (torch's `_IGNORE_OPS`), nor a prim op (prim.device, prim.layout: the dispatcher asking a tensor
    subclass, such as the trace's fake tensors, for its metadata; a real tensor reads a field)."""
    from torch.utils._runtime_estimation import _IGNORE_OPS

    return func._overloadpacket not in _IGNORE_OPS and func.namespace != "prim"


def ops_in(call, counted=launches) -> int:
    """How many ATen ops one `call()` dispatches (those `counted` counts: by default the roofline's)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += counted(func)
            return func(*args, **(kwargs or {}))

    with Count():
        call()
    return Count.ops


def seconds_per_op(seconds: float = 0.5) -> float:
    """What an op of a model's forward or backward costs this CPU beyond its FLOPs and bytes (modules' Python,
    autograd, the dispatcher, a kernel's set-up): a 2-layer, 32-wide BERT (transformers', as jobs run) at 1 x 8
    tokens, whose ops do next to nothing, stepped forward and backward; its time over the ops the roofline
    counts in it (`launches`)."""
    step = _tiny_bert_step()
    return median_seconds(step, seconds) / ops_in(step)


def seconds_per_recomputed_op(seconds: float = 0.5) -> float:
    """What an op that activation checkpointing recomputes costs this CPU beyond a model's op (seconds_per_op):
    the tiny BERT stepped with each layer checkpointed as a job checkpoints it, its time beyond the plain
    step's over the ops it recomputes, less the plain step's time per op. Method: docs/guide/measuring.md."""
    from ..techniques.checkpointing import enable

    plain, checkpointed = _tiny_bert_step(), _tiny_bert_step(enable)
    plain_ops = ops_in(plain)
    recomputed = ops_in(checkpointed) - plain_ops
    plain_s, checkpointed_s = median_seconds(plain, seconds), median_seconds(checkpointed, seconds)
    return max(0.0, (checkpointed_s - plain_s) / max(recomputed, 1) - plain_s / plain_ops)


def _tiny_bert(transform=lambda model: model):
    """A 2-layer, 32-wide BERT (`transform` applied to it) in training mode, and a batch of 1 x 8 tokens."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16)
    batch = {"input_ids": torch.ones(1, 8, dtype=torch.long), "labels": torch.zeros(1, dtype=torch.long)}
    return transform(BertForSequenceClassification(config).train()), batch


def _tiny_bert_step(transform=lambda model: model):
    """One forward and backward of the tiny BERT (`transform` applied to it)."""
    model, batch = _tiny_bert(transform)

    def step():
        model(**batch).loss.backward()
        model.zero_grad(set_to_none=True)
    return step


def seconds_per_module_walk(calls: int = 15) -> float:
    """What Trainer's own work on each micro-batch costs this CPU per module of the model: `model.train()` and
    `floating_point_ops` (`num_parameters`), each a walk over every module. Timed on the tiny BERT with the
    last-level cache swept before each call, as a micro-batch's tensors sweep it, over its modules.
    Method and measurements: docs/guide/measuring.md."""
    model, _ = _tiny_bert()

    def walks():
        model.train()
        model.num_parameters(exclude_embeddings=True)
    swept = median_seconds(walks, 0.0, warm=1, least=calls, most=calls, before=cache_sweep())
    return swept / len(list(model.modules()))


def cache_sweep():
    """A call that writes twice the last-level cache: after it, what the next call touches (its operands and
    output, its code and tables, the Python objects it walks) comes from memory, as after a micro-batch, or a
    layer of a step that streams more than the caches hold."""
    sweep = torch.empty(2 * last_cache_bytes() // 4)
    return lambda: sweep.fill_(1.0)


def seconds_per_call(calls: int = 100, seconds: float = 0.2) -> float:
    """What one op called from a Python loop (as an optimizer's step calls them) costs this CPU: an in-place add
    on a one-element tensor."""
    x = torch.zeros(1)

    def chain():
        for _ in range(calls):
            x.add_(1.0)
    return median_seconds(chain, seconds) / calls


def random_per_s(numel: int = 2 ** 22, seconds: float = 0.3) -> float:
    """Random numbers this CPU draws per second as dropout draws its mask (`bernoulli_`, 16 MiB of them)."""
    x = torch.empty(numel)
    return median_rate(lambda: x.bernoulli_(0.9), numel, seconds)


def seconds_per_page_fault(nbytes: int = 64 * 2**20) -> float:
    """What a fresh page costs this CPU on first touch: filling a newly made 64 MiB tensor, less filling one
    already paged in, over its pages."""
    numel, kept = nbytes // 4, torch.empty(nbytes // 4)
    kept.fill_(0.0)

    def fresh():
        torch.empty(numel).fill_(1.0)

    touched = median_seconds(lambda: kept.fill_(1.0), 0.2)
    return max(0.0, median_seconds(fresh, 0.3) - touched) / (nbytes // PAGE)


@functools.lru_cache(maxsize=1)
def last_cache_bytes() -> int:
    """The CPU's last-level cache (Linux sysfs: the highest cache index of cpu0); 32 MiB where it says none."""
    import glob
    from pathlib import Path

    sizes = [Path(f).read_text().strip() for f in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"))]
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(sizes[-1][:-1]) * units[sizes[-1][-1]] if sizes and sizes[-1][-1] in units else 32 * 2**20


def product_s(op: str, operands: tuple[Operand, ...]) -> float:
    """What one product of a step, or one op of products.MATH, takes this CPU at its own shapes, strides and dtype,
    with its operands and its output out of the caches as a step's are: the median over calls, each on its own
    copy of the operands and writing its own output, the copies together twice the last-level cache.
    Method and measurements: docs/guide/measuring.md."""
    return _product_at(op, operands, torch.get_num_threads())


def _made(value):
    """A product's argument from its record: a tensor of its shape, strides and dtype, or the scalar."""
    if not isinstance(value, TensorSpec):
        return value
    dtype = getattr(torch, value.dtype)
    return torch.empty_strided(value.shape, value.strides, dtype=dtype).fill_(1.0)  # its speed is not its values


@functools.lru_cache(maxsize=4096)
def _product_at(op: str, operands: tuple[Operand, ...], threads: int) -> float:
    namespace, name, overload = op.split(".")
    packet = getattr(getattr(torch.ops, namespace), name)

    def made() -> tuple[list, dict]:
        return ([_made(o.value) for o in operands if o.name is None],
                {o.name: _made(o.value) for o in operands if o.name is not None})

    func = getattr(packet, overload)
    args, kwargs = made()
    result = func(*args, **kwargs)

    def output():
        return torch.empty_strided(result.shape, result.stride(), dtype=result.dtype)

    # each operand's storage (its last element's offset, plus one) and the output's
    size = result.nbytes + sum(torch.empty(0, dtype=getattr(torch, o.value.dtype)).element_size()
                               * (1 + sum((n - 1) * st for n, st in zip(o.value.shape, o.value.strides)))
                               for o in operands if isinstance(o.value, TensorSpec))
    copies = max(2, min(64, 2 * last_cache_bytes() // max(size, 1)))  # two of more than the cache flush each other
    calls = itertools.cycle([(*made(), output()) for _ in range(copies)])

    # an op without an out= form (an elementwise gradient's is named otherwise) writes a fresh output
    into = getattr(packet, "out", None) if overload == "default" else None

    def call():
        args, kwargs, out = next(calls)
        into(*args, **kwargs, out=out) if into is not None else func(*args, **kwargs)
    return median_seconds(call, 0.05, warm=1, least=3, most=200)


@dataclass(frozen=True)
class CpuRates:
    """What this CPU does, measured at one thread count: matmul FLOP/s per dtype it runs natively, memory GB/s,
    the time per op beyond its work (a model's forward and backward op, an optimizer loop's op), random draws
    per second."""
    flops: dict[str, float]  # "fp32", and "bf16" where the CPU runs it natively
    memory_gbs: float
    s_per_op: float
    s_per_step_op: float
    random_per_s: float
    threads: int


def cpu_rates() -> CpuRates:
    """This CPU's rates, measured once per thread count torch runs with."""
    return measured_at(torch.get_num_threads())


@functools.lru_cache(maxsize=4)
def measured_at(threads: int) -> CpuRates:
    """cpu_rates at `threads` (the key of the cache: torch runs at that count while they are measured)."""
    from ..config.hardware import cpu_native_precisions

    flops = {"fp32": matmul_flops(torch.float32)}
    bf16, _ = cpu_native_precisions()
    if bf16:
        flops["bf16"] = matmul_flops(torch.bfloat16)
    return CpuRates(flops=flops, memory_gbs=copy_bytes_s() / 1e9, s_per_op=seconds_per_op(),
                    s_per_step_op=seconds_per_call(), random_per_s=random_per_s(), threads=torch.get_num_threads())


def fresh_page_s() -> float:
    """seconds_per_page_fault at the thread count torch runs with, measured once per count, and only when a job
    needs it (one that hands freed host memory back: measure/host_memory.py keeps it by default)."""
    return _once_per_threads(seconds_per_page_fault, torch.get_num_threads())


def module_walk_s() -> float:
    """seconds_per_module_walk at the thread count torch runs with, measured once per count, and only when a
    job's step is timed on this CPU."""
    return _once_per_threads(seconds_per_module_walk, torch.get_num_threads())


def recomputed_op_s() -> float:
    """seconds_per_recomputed_op at the thread count torch runs with, measured once per count, and only when a
    job's step recomputes (activation checkpointing)."""
    return _once_per_threads(seconds_per_recomputed_op, torch.get_num_threads())


@functools.lru_cache(maxsize=16)
def _once_per_threads(measure, threads: int) -> float:
    """`measure()`, once per measurement and thread count (the cache's key: torch runs at that count meanwhile)."""
    return measure()
