"""Step time predicted per operation on the trace's fake step, without running it (a plan ranks jobs it never
runs, on hardware it may not have): each op takes the longer of its FLOPs at the compute rate and its bytes at
the memory bandwidth (a roofline, torch's RuntimeEstimator's cost model) at a hardware profile's rates; the ops
are launched by the host and queued on a GPU, called then run on a CPU; the step waits for offload's host
copies and the collectives that outlast what they overlap. The method, its measured ceilings and what it
leaves out: docs/estimator/step-time.md."""
from dataclasses import dataclass

from ..measure import peak
from . import collectives, host_copies, host_cost
from .capture import PagedIn
from .collectives import Collectives
from .host_copies import HostCopies
from .op_record import PHASES, RANDOM, CountedOp, OpCost
from .products import CountedProduct
from .step_time import StepTime
from .traced import Trace

GB = 1e9
# What a CUDA card reaches of its datasheet and what its host costs, measured on an H200 (benchmarks/GPU.md)
MATMUL_CEILING = 0.76  # cuBLAS's 8192-cube products: 0.74-0.77 of the dense peak (benchmarks/gpu_rates.py)
MEMORY_CEILING = 0.88  # a device-to-device copy: 4,217 of 4,800 GB/s (benchmarks/gpu_rates.py)
HOST_S_PER_OP = 42e-6  # a forward or backward op: bert-base under the Trainer, bf16 and fp16 (benchmarks/GPU.md)
HOST_S_PER_STEP_OP = 6.7e-6  # an op called from a Python loop: in-place adds on one element (benchmarks/gpu_rates.py)
KERNEL_MIN_S = 3e-6  # the shortest kernel: a tiny BERT's step ran 313 in 0.91 ms (docs/estimator/step-time.md)
HOST_STEP_NOTE = ("the optimizer steps on the host's CPU: that step is not timed (a lower bound; the copies to and "
                  "from it are)")


@dataclass(frozen=True)
class PhaseSeconds:
    """Ops' seconds per phase of the step (op_record.PHASES), and the same seconds by what bounds each op."""
    forward: float = 0.0
    backward: float = 0.0
    accumulate: float = 0.0
    step: float = 0.0
    compute_bound_s: float = 0.0  # the ops that take longer than their bytes at the bandwidth
    memory_bound_s: float = 0.0

    def plus(self, other: "PhaseSeconds") -> "PhaseSeconds":
        return PhaseSeconds(forward=self.forward + other.forward, backward=self.backward + other.backward,
                            accumulate=self.accumulate + other.accumulate, step=self.step + other.step,
                            compute_bound_s=self.compute_bound_s + other.compute_bound_s,
                            memory_bound_s=self.memory_bound_s + other.memory_bound_s)


@dataclass(frozen=True)
class PhaseOps:
    """How many ops each phase of the step runs (op_record.PHASES): one micro-batch's forward and backward, the
    adds of one later micro-batch, the optimizer step."""
    forward: int = 0
    backward: int = 0
    accumulate: int = 0
    step: int = 0


@dataclass(frozen=True)
class Parts:
    """The record's ops timed at a profile's rates (seconds): per phase, with the compute dtypes it has no rate for."""
    seconds: PhaseSeconds
    ops: PhaseOps
    no_rate: list[str]


@dataclass(frozen=True)
class Rates:
    """What a profile's device runs ops at (rates_of): its peaks, its host's cost per op, and how its ops run."""
    flops: dict[str, float]  # peak FLOP/s per compute dtype key (fp32, tf32, fp16, bf16)
    memory_bytes_s: float  # device memory bandwidth
    host_bytes_s: float | None  # host link (PCIe) bandwidth, one direction
    fp32_key: str = "fp32"  # "tf32" where fp32 matmuls run on TF32 tensor cores
    source: str = "profile (datasheet)"
    host_s_per_op: float = 0.0  # the host's dispatch of one forward or backward op, which the GPU cannot run ahead of
    host_s_per_step_op: float = 0.0  # ... of one op of the optimizer's step (a plain call from a Python loop)
    kernel_min_s: float = 0.0  # the shortest a GPU kernel takes, whatever its FLOPs and bytes
    random_per_s: float = 0.0  # random numbers drawn per second; 0: drawing is never what an op waits for
    serial: bool = False  # the ops run on the thread that calls them (a CPU): each op's call, then its work
    traffic_hidden: bool = True  # a FLOP-counted op's bytes move while it computes; False: before and after
    timed_products: bool = False  # the step's products and math ops timed on this CPU at their shapes (product_s)


def op_s(dtype: str, flops: int, moved: int, rates: Rates) -> tuple[float, float, bool]:
    """(compute seconds, memory seconds, a rate missing) of one op; a GPU kernel takes at least KERNEL_MIN_S."""
    memory_s = max(moved / rates.memory_bytes_s, rates.kernel_min_s)
    if dtype == RANDOM:
        return (flops / rates.random_per_s if rates.random_per_s else 0.0), memory_s, False
    dtype = rates.fp32_key if dtype == "fp32" else dtype
    rate = rates.flops.get(dtype) or (rates.flops.get("fp32") if dtype == "tf32" else None)
    return (flops / rate if flops and rate else 0.0), memory_s, bool(flops and not rate)


def op_time(dtype: str, flops: int, moved: int, rates: Rates) -> float:
    """An op's seconds: the longer of its math and its bytes (the roofline), or on a GPU, for an op with
    FLOPs, the two one after the other (Rates.traffic_hidden: docs/estimator/step-time.md)."""
    compute_s, memory_s, _ = op_s(dtype, flops, moved, rates)
    return compute_s + memory_s if compute_s and not rates.traffic_hidden else max(compute_s, memory_s)


def seconds(ops: list[CountedOp], rates: Rates, timed: list[CountedProduct] | None = None) -> Parts:
    """One micro-batch's forward and backward and the optimizer step, timed at `rates`, its products `timed` on
    this CPU where given (products_s); which ops bound it."""
    spent, counted = dict.fromkeys(PHASES, 0.0), dict.fromkeys(PHASES, 0)
    compute_bound_s = memory_bound_s = 0.0
    no_rate = set()
    for op in ops:
        counted[op.phase] += op.times
        compute_s, memory_s, missing = op_s(op.dtype, op.flops, op.moved, rates)
        if missing:
            no_rate.add(op.dtype)
        took = op.times * op_time(op.dtype, op.flops, op.moved, rates)
        spent[op.phase] += took
        if compute_s > memory_s:
            compute_bound_s += took
        else:
            memory_bound_s += took
    roofline = PhaseSeconds(**spent, compute_bound_s=compute_bound_s, memory_bound_s=memory_bound_s)
    return Parts(roofline.plus(products_s(timed or [], rates)), PhaseOps(**counted), sorted(no_rate))


def products_s(products: list[CountedProduct], rates: Rates) -> PhaseSeconds:
    """Per phase, what timing the step's products and math ops (products.TIMED) on this CPU at their shapes
    (peak.product_s) adds to their roofline at its rates (a 1,024-square product's rate, each product's best; a
    math op's bytes); and each op's seconds moved to what bounds it so timed (`compute_bound_s` where it takes
    longer than its bytes at the bandwidth, else `memory_bound_s`)."""
    added = dict.fromkeys(PHASES, 0.0)
    compute_bound_s = memory_bound_s = 0.0
    for product in products:
        compute_s, memory_s, _ = op_s(product.dtype, product.flops, product.moved, rates)
        roofline_s = op_time(product.dtype, product.flops, product.moved, rates)
        timed_s = peak.product_s(product.op, product.operands)
        added[product.phase] += product.times * (timed_s - roofline_s)
        if compute_s > memory_s:
            compute_bound_s -= product.times * roofline_s
        else:
            memory_bound_s -= product.times * roofline_s
        if timed_s > memory_s:
            compute_bound_s += product.times * timed_s
        else:
            memory_bound_s += product.times * timed_s
    return PhaseSeconds(**added, compute_bound_s=compute_bound_s, memory_bound_s=memory_bound_s)


def queued_s(sequence: list[OpCost], rates: Rates, accumulation: int) -> float:
    """A step as eager PyTorch runs it on a GPU: the host launches the ops one after another (host_s_per_op
    each), the GPU runs each once it is launched and the one before has finished. Each micro-batch starts
    from an idle queue: its batch is copied from pageable host memory, and "for transfers from pageable host
    memory to device memory, a stream sync is performed before the copy is initiated" (CUDA Runtime API,
    API synchronization behavior). Each micro-batch after the first adds its gradients into the first's
    (the "accumulate" ops, launched by autograd's engine as an optimizer's loop launches its ops); the optimizer
    step follows the last backward in the same queue."""
    # each distinct op's (host, device) seconds once: a step repeats the same few hundred ops per block
    cost = {op: (rates.host_s_per_op if op.phase in ("forward", "backward") else rates.host_s_per_step_op,
                 op_time(op.dtype, op.flops, op.moved, rates)) for op in set(sequence)}

    def run(ops, host: float = 0.0, gpu: float = 0.0) -> tuple[float, float]:  # (host, GPU) once `ops` are in
        for op in ops:
            launch, kernel = cost[op]
            host += launch
            gpu = max(gpu, host) + kernel
        return host, gpu

    micro_batch = [op for op in sequence if op.phase in ("forward", "backward")]
    added, step = ([op for op in sequence if op.phase == phase] for phase in ("accumulate", "step"))
    first = run(micro_batch)  # every micro-batch runs these first, from an idle queue: run once, carried on
    if accumulation == 1:
        return max(run(step, *first))
    later = run(added, *first)
    return max(first) + (accumulation - 2) * max(later) + max(run(step, *later))


def forward_only_s(sequence: list[OpCost], parts: Parts, rates: Rates) -> float:
    """One micro-batch's forward alone (an evaluation batch of the same size): its ops as the step runs them,
    launched by the host on a GPU, called then run on a CPU."""
    forward = [op for op in sequence if op.phase == "forward"]
    if rates.serial or not forward:
        dispatch = parts.ops.forward * rates.host_s_per_op
        return parts.seconds.forward + dispatch if rates.serial else max(parts.seconds.forward, dispatch)
    return queued_s(forward, rates, 1)


def rates_of(profile, compute_key: str, model_type: str | None = None) -> Rates | None:
    """The profile's rates, or None where it has no memory bandwidth (a step cannot be timed). On a CPU
    profile without them, this machine's, measured once (measure/peak.py). A model's op costs the host what
    `model_type`'s cost relative to BERT's (host_cost.py)."""
    on_gpu = profile.device == "cuda"
    flops = {k: v * 1e12 * (MATMUL_CEILING if on_gpu else 1.0) for k, v in profile.tflops.items()}
    memory, host, source = profile.memory_gbs, profile.host_link_gbs, "profile (datasheet)"
    per_op, per_step_op, random_per_s = (HOST_S_PER_OP, HOST_S_PER_STEP_OP, 0.0) if on_gpu else (0.0, 0.0, 0.0)
    if on_gpu and memory:
        memory, source = memory * MEMORY_CEILING, "profile (datasheet) x the ceilings measured on an H200"
    if profile.device == "cpu":
        measured = peak.cpu_rates()  # what an op costs this CPU beyond its work, whatever the rates' source
        per_op, per_step_op, random_per_s = measured.s_per_op, measured.s_per_step_op, measured.random_per_s
        if not flops or memory is None:
            flops, memory, host = {**measured.flops, **flops}, memory or measured.memory_gbs, None
            source = f"this CPU, measured at start-up ({measured.threads} threads)"
    if memory is None:
        return None
    return Rates(flops=flops, memory_bytes_s=memory * GB, host_bytes_s=host * GB if host else None,
                 fp32_key="tf32" if compute_key == "tf32" else "fp32", source=source,
                 host_s_per_op=per_op * host_cost.relative(model_type), host_s_per_step_op=per_step_op,
                 kernel_min_s=KERNEL_MIN_S if on_gpu else 0.0, serial=not on_gpu, random_per_s=random_per_s,
                 traffic_hidden=not on_gpu, timed_products=source.startswith("this CPU"))


def step_time(traced: Trace, setup, profile, pages_anew: bool = False, model_type: str | None = None,
              distributed=None) -> StepTime:
    """The predicted time of one optimizer step: on a GPU the host's launches of the ops and the device's
    kernels (queued_s: accumulation x a micro-batch's forward + backward, then the optimizer step); on a CPU
    the ops' sum; plus activation offload's host copies (save_on_cpu: each saved tensor to the host in forward
    and back in backward, over the host link) and what optimizer offload's copies add (host_copies.py). With its
    parts; `step_s` None with the reason where it cannot be predicted. `pages_anew`: the process hands freed host
    memory back to the OS (no malloc_reuse), so on a CPU the step's large tensors are paged in again each time they
    are made; `model_type`'s ops cost the host theirs; several processes (`distributed`) wait for collectives that
    outlast what they overlap (collectives.waited)."""
    rates = rates_of(profile, setup.techniques.precision.compute, model_type)
    if rates is None:
        return StepTime(step_s=None, why_not=f"profile {profile.name} has no memory_gbs (memory bandwidth)")
    parts = seconds(traced.roofline_ops, rates, traced.roofline_products if rates.timed_products else None)
    accumulation = setup.accumulation_steps
    offloaded = traced.offloaded_bytes_per_micro_batch
    copies = host_copies.waited(traced, setup, rates.host_bytes_s, accumulation * parts.seconds.forward,
                                accumulation * parts.seconds.backward)  # optimizer offload's, over the host link
    if (offloaded or copies is not None) and rates.host_bytes_s is None:
        return StepTime(step_s=None, why_not=f"profile {profile.name} has no host_link_gbs for offload's copies")
    host_s = accumulation * 2 * offloaded / rates.host_bytes_s if offloaded else 0.0
    # the optimizer stepping on the host (adjust.py) runs no op on the device: its step is not timed
    on_device = not traced.optimizer_on_host
    ops, micro_batch_s = parts.ops.forward + parts.ops.backward, parts.seconds.forward + parts.seconds.backward
    # each micro-batch after the first adds its gradients into the first's
    accumulate_s = (accumulation - 1) * parts.seconds.accumulate
    device_s = accumulation * micro_batch_s + accumulate_s + on_device * parts.seconds.step
    dispatch_s = host_calls_s(parts, traced, rates, model_type, accumulation, on_device)
    sequence = [op for op in traced.roofline_sequence if on_device or op.phase != "step"]
    pages_s, forward_pages_s = paged_in_s(traced, rates, pages_anew, accumulation, on_device)
    if rates.serial:
        queue_s = device_s + dispatch_s + pages_s
    else:
        queue_s = queued_s(sequence, rates, accumulation) if sequence and dispatch_s else max(device_s, dispatch_s)
    comm = collectives.waited(traced, setup, profile, distributed, accumulation * micro_batch_s)
    why_not = f"profile {profile.name} has no peak rate for {', '.join(parts.no_rate)}" if parts.no_rate else None
    return StepTime(
        step_s=None if why_not else queue_s + host_s + waited_s(comm) + waited_s(copies), why_not=why_not,
        forward_s=parts.seconds.forward, backward_s=parts.seconds.backward,
        forward_only_s=forward_only_s(sequence, parts, rates) + forward_pages_s, accumulate_s=accumulate_s,
        optimizer_s=on_device * parts.seconds.step, host_transfer_s=host_s, accumulation_steps=accumulation,
        device_s=device_s, dispatch_s=dispatch_s, paged_in_s=pages_s,
        idle_s=queue_s - device_s - pages_s,  # waiting for launches
        bound="host dispatch" if dispatch_s > device_s else "device",
        ops_per_micro_batch=ops, ops_accumulating=parts.ops.accumulate,
        ops_recomputed=traced.recomputed_ops, modules_walked=traced.modules,
        ops_in_optimizer_step=parts.ops.step, gpu_us_per_op=1e6 * micro_batch_s / ops if ops else None,
        compute_bound_share=parts.seconds.compute_bound_s / max(
            parts.seconds.compute_bound_s + parts.seconds.memory_bound_s, 1e-30),
        rates=rates.source, method="roofline per op (torch RuntimeEstimator), launched by the host",
        collectives=comm, host_copies=copies, note=left_out(why_not, on_device, comm))


def waited_s(transfers: Collectives | HostCopies | None) -> float:
    """What the step waits for a part's transfers (none where there are none, or they are not timed)."""
    return 0.0 if transfers is None else transfers.waited_s


def left_out(why_not: str | None, on_device: bool, comm: Collectives | None) -> str | None:
    """One note of every part of the step left out: the optimizer's step on the host (unless a missing rate leaves
    the whole step untimed) and collectives without a link; None where nothing is."""
    notes = []
    if not (on_device or why_not):
        notes.append(HOST_STEP_NOTE)
    if comm is not None and comm.note:
        notes.append(comm.note)
    return "; ".join(notes) if notes else None


def paged_in_s(traced: Trace, rates: Rates, pages_anew: bool, accumulation: int,
               on_device: bool) -> tuple[float, float]:
    """(a step's, a micro-batch's forward's) seconds paging in the large tensors it makes anew, on a CPU whose
    process hands freed memory back to the OS; a GPU's allocator caches its blocks."""
    paged = traced.paged_in_bytes if pages_anew and rates.serial else PagedIn()
    per_byte = peak.fresh_page_s() / peak.PAGE if paged.forward or paged.backward or paged.step else 0.0
    made = accumulation * (paged.forward + paged.backward) + on_device * paged.step
    return made * per_byte, paged.forward * per_byte


def host_calls_s(parts: Parts, traced: Trace, rates: Rates, model_type: str | None, accumulation: int,
                 on_device: bool) -> float:
    """The host's calls of a step's ops: each micro-batch's forward and backward ops at a model's op's cost,
    with checkpointing's hooks and Trainer's walks; the accumulating adds and the optimizer's ops at a bare
    call's (autograd's engine calls the adds from C++, without a module's Python)."""
    micro_batch = (parts.ops.forward + parts.ops.backward) * rates.host_s_per_op \
        + recompute_hooks_s(traced.recomputed_ops, rates, model_type) + trainer_walks_s(traced.modules, rates)
    bare = (accumulation - 1) * parts.ops.accumulate + on_device * parts.ops.step
    return accumulation * micro_batch + bare * rates.host_s_per_step_op


def recompute_hooks_s(recomputed: int, rates: Rates, model_type: str | None) -> float:
    """What activation checkpointing's hooks cost the host per micro-batch beyond the recomputed ops' own calls:
    on a CPU, each recomputed op (op_record.Roofline.recomputed) at what this CPU measured for one
    (peak.recomputed_op_s: MiniLM at 1 x 30 tokens took 21-23 ms longer a micro-batch checkpointed, its
    recomputed forward's ops and calls 12.5 ms of it), as a model's op costs the host relative to BERT's
    (host_cost.py). On a GPU profile not measured (no card here to measure it on): none."""
    if not recomputed or not rates.serial:
        return 0.0
    return recomputed * peak.recomputed_op_s() * host_cost.relative(model_type)


def trainer_walks_s(modules: int, rates: Rates) -> float:
    """What Trainer's own work costs the host per micro-batch: `model.train()` in its training_step and
    `floating_point_ops` (num_parameters) in its loop each walk every module of the model (the trace's count of
    them). On a CPU at what this CPU measured per module (peak.module_walk_s); on a GPU profile not measured (no
    card here, and the host walks while the device runs the queue the micro-batch before launched): none."""
    return modules * peak.module_walk_s() if modules and rates.serial else 0.0
