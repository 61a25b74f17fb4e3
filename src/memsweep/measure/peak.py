"""This CPU's peak rates, measured once per process: what the roofline (estimate/roofline.py) times a CPU
step at, as `make bench` measures its matmul ceiling (benchmarks/hw_efficiency.py): a large square
`torch.mm` per dtype, a large copy for memory bandwidth, dropout's random draws (`bernoulli_`), and what
an op costs beyond its work (a tiny model's step; a call from a Python loop). Measured at the thread count
torch runs with, so a prediction and a job of the same process compare like with like."""
import functools
import itertools
import statistics
import time

import torch

from ..run.host_memory import PAGE  # what a fresh page is (glibc's malloc)


def median_seconds(run, seconds: float, sync=lambda: None, warm: int = 2, least: int = 5,
                   most: float = float("inf")) -> float:
    """Median seconds of a call of `run` over about `seconds` of calls (at least `least`, at most `most`), after
    `warm` calls that are not counted; `sync` waits for the device after each (torch.cuda.synchronize where the
    work runs on a GPU)."""
    for _ in range(warm):
        run()
    sync()
    took, spent = [], 0.0
    while len(took) < least or (spent < seconds and len(took) < most):
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
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16)
    model = BertForSequenceClassification(config).train()
    batch = {"input_ids": torch.ones(1, 8, dtype=torch.long), "labels": torch.zeros(1, dtype=torch.long)}

    def step():
        model(**batch).loss.backward()
        model.zero_grad(set_to_none=True)

    return median_seconds(step, seconds) / ops_in(step)


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


def product_s(op: str, operands: tuple) -> float:
    """What one product of a step (estimate/products.py) takes this CPU at its own shapes, strides and dtype,
    with its operands out of the caches as a step's are (each layer's weights and activations are read once,
    and the step's bytes are far more than the caches hold): median over calls, each on its own copy of the
    operands, the copies together twice the last-level cache (triton's do_bench flushes the cache between
    calls for the same reason). A 1,024-square product's rate is a product's best: MiniLM's forward products
    at 32 rows took 1.5-1.6 times as long with cold operands as with hot ones, its weights' gradients 1.05-1.1."""
    return _product_at(op, operands, torch.get_num_threads())


@functools.lru_cache(maxsize=4096)
def _product_at(op: str, operands: tuple, threads: int) -> float:
    namespace, name, overload = op.split(".")
    func = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    # each operand's storage: its last element's offset, plus one
    size = sum(torch.empty(0, dtype=getattr(torch, v[3])).element_size()
               * (1 + sum((n - 1) * st for n, st in zip(v[1], v[2]))) for _, v in operands if isinstance(v, tuple))
    copies = max(2, min(64, 2 * last_cache_bytes() // max(size, 1)))  # two of more than the cache flush each other

    def made(value):
        if not isinstance(value, tuple):
            return value
        shape, strides, dtype = value[1], value[2], getattr(torch, value[3])
        return torch.empty_strided(shape, strides, dtype=dtype).fill_(1.0)  # a product's speed is not its values

    calls = itertools.cycle([([made(v) for k, v in operands if k is None],
                              {k: made(v) for k, v in operands if k is not None}) for _ in range(copies)])

    def call():
        args, kwargs = next(calls)
        func(*args, **kwargs)
    return median_seconds(call, 0.05, warm=1, least=3, most=200)


def cpu_rates() -> dict:
    """FLOP/s for fp32 (and bf16 where it runs natively), memory GB/s, the time per op beyond its work (of a
    model's forward and backward, of an optimizer's loop), random draws per second, the thread count: measured
    once per thread count torch runs with."""
    return measured_at(torch.get_num_threads())


@functools.lru_cache(maxsize=4)
def measured_at(threads: int) -> dict:
    """cpu_rates at `threads` (the key of the cache: torch runs at that count while they are measured)."""
    from ..config.hardware import cpu_native_precisions

    flops = {"fp32": matmul_flops(torch.float32)}
    bf16, _ = cpu_native_precisions()
    if bf16:
        flops["bf16"] = matmul_flops(torch.bfloat16)
    return {"flops": flops, "memory_gbs": copy_bytes_s() / 1e9, "s_per_op": seconds_per_op(),
            "s_per_step_op": seconds_per_call(), "random_per_s": random_per_s(), "threads": torch.get_num_threads()}


def fresh_page_s() -> float:
    """seconds_per_page_fault at the thread count torch runs with, measured once per count, and only when a job
    needs it (one that hands freed host memory back: run/host_memory.py keeps it by default)."""
    return _fresh_page_at(torch.get_num_threads())


@functools.lru_cache(maxsize=4)
def _fresh_page_at(threads: int) -> float:
    return seconds_per_page_fault()
