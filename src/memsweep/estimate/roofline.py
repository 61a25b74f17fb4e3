"""Step time predicted per operation on the trace's fake step: a roofline, and the host that feeds it.

Each ATen op the step runs takes max(FLOPs / compute rate, bytes moved / memory bandwidth), as torch's
RuntimeEstimator does in its cost-model mode (`torch/distributed/_tools/runtime_estimator.py`), on the
trace's record of each op (op_record.py: built on that class); the rates come from the hardware profile
instead of the GPU this process runs on (there is none). Summed over the ops as
a GPU runs them one after another on one stream.

A GPU profile's rates are its datasheet's; what a card reaches of them was measured on one (an H200,
benchmarks/gpu_rates.py, benchmarks/GPU.md) and is applied to every CUDA profile, each a named mechanism:
- MATMUL_CEILING: cuBLAS's largest products (8192 x 8192 x 8192) reach 0.74-0.77 of the dense datasheet
  peak in fp32, TF32, fp16 and bf16 (torch's own `flops_to_ns` assumes 0.75);
- MEMORY_CEILING: a device-to-device copy moves 0.88 of the datasheet bandwidth (4,217 of 4,800 GB/s);
- a product's traffic is not hidden (Rates.traffic_hidden False on a GPU): its time is its math at the
  ceiling plus its operands' and result's bytes at the bandwidth, not the longer of the two (benchmarks/
  gpu_gemm_shapes.py, gpu_snapshots/h200_gemm.json: over 182 products of 2,048-32,768 rows into fine-tuning
  widths, 768-32,000, in bf16, TF32 and fp32, the sum is -0.7 % off the median product's measured time, the
  longer of the two -14.7 %; a 768-wide bf16 product of 32,768 rows: 76 us measured, 51 us of math and 24 us
  of traffic). The tile pipeline loads its first operands before any math and writes the result after the
  last: at a transformer's widths that does not hide;
- KERNEL_MIN_S: a kernel takes a few microseconds however little it does: the 2-layer, 64-wide BERT's
  fixed-shape step ran 313 kernels in 0.91 ms of GPU time (bf16 autocast; fp32: 239 in 0.99 ms);
- HOST_S_PER_STEP_OP: an op called in a Python loop, as an optimizer's step calls them, costs the host
  6.7 us (a chain of in-place adds on a one-element tensor);
- HOST_S_PER_OP: an op of a model's forward or backward costs more (modules' Python, autograd's engine):
  bert-base's shape at 32 x 128 tokens under the Trainer, in bf16 and fp16 autocast, keeps the GPU busy
  for about 9 ms of a 48.6 / 44.8 ms step; less its 615 optimizer ops at 6.7 us, 44.4 / 40.5 us for each
  of its 1,002 forward and backward ops (42 us taken; a plain loop without the Trainer: 21-32 us); another
  architecture's ops cost its host more or less than BERT's (host_cost.py: Llama's 0.64 of it, ViT's 1.39);
The host launches, the GPU runs each op once launched and after the one before (queued_s): a step of
small ops waits on the host (bert-base bf16 at 32 x 128 tokens in a plain loop: 11.1 ms of kernels in a
52-55 ms step), one of large matmuls on the GPU (fp32: 56.4 ms of kernels in a 57.5-59.2 ms step).
A CPU profile's rates are measured on this CPU at start-up: no ceiling applies, and the ops run on the
thread that calls them, so a CPU step is each op's call and then its work, one after the other. A CPU core's
memory time is the lines it reads in (a fresh output's too, write-allocate); an output written over an input
adds none (op_record.moved_bytes: an in-place add ran 1.6 times a copy's counted rate here). A
1,024-square product's rate is a product's best: the step's own products (mm, addmm, bmm, baddbmm) are
timed on this CPU at their shapes, strides and dtype, their operands and outputs out of the caches as a step's
are (measure/peak.product_s). MiniLM at 1 x 32 tokens in a plain loop: its products took 38.7 of a micro-batch's
67 ms, where the square rate said 23; timed so (benchmarks/cpu_ops_in_model.py, 1 x 30 tokens), each shape came
within 0.9-1.1 of its in-model time. So are the ops that evaluate an exponential, erf or tanh per element
(softmax, GELU, SiLU: products.MATH), whose math the roofline has no FLOPs for: at 32 x 64 tokens MiniLM's
softmax took 23.7 ms a micro-batch in the model, 1.8 at its bytes, 22.3 timed so. An op's call costs what
this CPU measured (measure/peak.py): a model's op the time of a tiny BERT's forward and backward (1 x 8 tokens,
next to no work) over its ops, an optimizer's op a bare call from a Python loop.
And dropout on a CPU draws a random number per element (`bernoulli_`), which takes far longer than moving its
bytes: those ops take their draws at the rate this CPU draws them (measured); a GPU's dropout kernel draws
in registers (Philox) and stays bound by its bytes. And where a job hands freed host memory back to the OS
(`malloc_reuse=false`; measure/host_memory.py keeps it by default) a CPU pages in anew each tensor of more than 32 MiB
a step makes (glibc's malloc maps it fresh and unmaps it on free; the kernel faults in each 4 KiB page on its
first touch): the step adds this CPU's measured cost per page for those the trace's step allocates
(capture.paged_in; MiniLM's word-embedding gradient, 47 MB each micro-batch: 11,446 pages at 1.6 us here). A GPU's
caching allocator keeps its blocks.

What the sum holds, because it is the step the memory trace runs: forward, backward with checkpointing's recomputed
forward, each later micro-batch's gradients added into the first's (accumulation: one add per parameter; MiniLM at
1 x 30 tokens, fp32, one thread here: 105 adds took 8.3 ms of a 67 ms micro-batch), gradient clipping, the
optimizer step (memory-bound: it reads and writes every state tensor; under DeepSpeed ZeRO the engine's step over
the process's flat partition, recorded on its own: step.flat_partition_ops) and bitsandbytes' quantize / dequantize ops
(each dispatched as an op with its bytes). What it adds outside the ops: activation offload's host copies over the
profile's host link, optimizer offload's copies of gradients and updated values (host_copies.py; the host's own
optimizer step is not timed: such a step is a lower bound), and on a CPU activation checkpointing's saved-tensor
hooks (recompute_hooks_s) and Trainer's walks over the model's modules each micro-batch (trainer_walks_s). What it
leaves out: data loading, the rest of a training loop's own work (a Trainer's callbacks and logging: 7-11 ms a step
of 32 micro-batches for MiniLM here), checkpointing's hooks and Trainer's walks on a GPU's host, TF32 products with
a transposed first operand (a weight's gradient: 0.25-0.5 of the datasheet on the H200, a third slower than the
sum), products of widths that are not multiples of 8 (a batched 197 x 64 x 197 product: 4 times the sum). Several
processes' collectives are added where they outlast the compute they overlap (collectives_waited, collectives.py).
"""
from dataclasses import dataclass

from ..measure import peak
from . import collectives, host_copies, host_cost

GB = 1e9
# What a CUDA card reaches of its datasheet, measured on an H200 (module docstring, benchmarks/GPU.md)
MATMUL_CEILING = 0.76
MEMORY_CEILING = 0.88
HOST_S_PER_OP = 42e-6
HOST_S_PER_STEP_OP = 6.7e-6
KERNEL_MIN_S = 3e-6
from .op_record import PHASES, RANDOM


@dataclass(frozen=True)
class Rates:
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


def op_s(key: str, flops: int, moved: int, rates: Rates) -> tuple[float, float, bool]:
    """(compute seconds, memory seconds, a rate missing) of one op; a GPU kernel takes at least KERNEL_MIN_S."""
    memory_s = max(moved / rates.memory_bytes_s, rates.kernel_min_s)
    if key == RANDOM:
        return (flops / rates.random_per_s if rates.random_per_s else 0.0), memory_s, False
    key = rates.fp32_key if key == "fp32" else key
    rate = rates.flops.get(key) or (rates.flops.get("fp32") if key == "tf32" else None)
    return (flops / rate if flops and rate else 0.0), memory_s, bool(flops and not rate)


def op_time(key: str, flops: int, moved: int, rates: Rates) -> float:
    """An op's seconds: the longer of its math and its bytes (the roofline), or on a GPU, for an op with
    FLOPs, the two one after the other (Rates.traffic_hidden: the module docstring)."""
    compute_s, memory_s, _ = op_s(key, flops, moved, rates)
    return compute_s + memory_s if compute_s and not rates.traffic_hidden else max(compute_s, memory_s)


def seconds(ops: list, rates: Rates, timed: list | None = None) -> dict:
    """One micro-batch's forward and backward and the optimizer step, timed at `rates`, its products `timed` on
    this CPU where given (products_s); which ops bound it."""
    out = {**{p: 0.0 for p in PHASES}, "compute_bound_s": 0.0, "memory_bound_s": 0.0, "ops": dict.fromkeys(PHASES, 0)}
    no_rate = set()
    for phase, key, flops, moved, n in ops:
        out["ops"][phase] += n
        compute_s, memory_s, missing = op_s(key, flops, moved, rates)
        if missing:
            no_rate.add(key)
        took = op_time(key, flops, moved, rates)
        out[phase] += n * took
        out["compute_bound_s" if compute_s > memory_s else "memory_bound_s"] += n * took
    for part, took in products_s(timed or [], rates).items():
        out[part] += took
    return {**out, "no_rate": sorted(no_rate)}


def products_s(products: list, rates: Rates) -> dict:
    """Per phase, what timing the step's products and math ops (products.TIMED) on this CPU at their shapes
    (peak.product_s) adds to their roofline at its rates (a 1,024-square product's rate, each product's best; a
    math op's bytes); and each op's seconds moved to what bounds it so timed (`compute_bound_s` where it takes
    longer than its bytes at the bandwidth, else `memory_bound_s`)."""
    out = dict.fromkeys((*PHASES, "compute_bound_s", "memory_bound_s"), 0.0)
    for phase, op, operands, key, flops, moved, n in products:
        compute_s, memory_s, _ = op_s(key, flops, moved, rates)
        roofline_s, timed_s = op_time(key, flops, moved, rates), peak.product_s(op, operands)
        out[phase] += n * (timed_s - roofline_s)
        out["compute_bound_s" if compute_s > memory_s else "memory_bound_s"] -= n * roofline_s
        out["compute_bound_s" if timed_s > memory_s else "memory_bound_s"] += n * timed_s
    return out


def queued_s(sequence: list, rates: Rates, accumulation: int) -> float:
    """A step as eager PyTorch runs it on a GPU: the host launches the ops one after another (host_s_per_op
    each), the GPU runs each once it is launched and the one before has finished. Each micro-batch starts
    from an idle queue: its batch is copied from pageable host memory, and "for transfers from pageable host
    memory to device memory, a stream sync is performed before the copy is initiated" (CUDA Runtime API,
    API synchronization behavior). Each micro-batch after the first adds its gradients into the first's
    (the "accumulate" ops, launched by autograd's engine as an optimizer's loop launches its ops); the optimizer
    step follows the last backward in the same queue."""
    sequence = [tuple(op) for op in sequence]  # a cached trace may hold them as lists
    # each distinct op's (host, device) seconds once: a step repeats the same few hundred ops per block
    cost = {op: (rates.host_s_per_op if op[0] in ("forward", "backward") else rates.host_s_per_step_op,
                 op_time(*op[1:], rates)) for op in set(sequence)}

    def run(ops, host: float = 0.0, gpu: float = 0.0) -> tuple[float, float]:  # (host, GPU) once `ops` are in
        for op in ops:
            launch, kernel = cost[op]
            host += launch
            gpu = max(gpu, host) + kernel
        return host, gpu

    micro_batch = [op for op in sequence if op[0] in ("forward", "backward")]
    added, step = ([op for op in sequence if op[0] == phase] for phase in ("accumulate", "step"))
    first = run(micro_batch)  # every micro-batch runs these first, from an idle queue: run once, carried on
    if accumulation == 1:
        return max(run(step, *first))
    later = run(added, *first)
    return max(first) + (accumulation - 2) * max(later) + max(run(step, *later))


def forward_only_s(sequence: list, parts: dict, rates: Rates) -> float:
    """One micro-batch's forward alone (an evaluation batch of the same size): its ops as the step runs them,
    launched by the host on a GPU, called then run on a CPU."""
    forward = [op for op in sequence if op[0] == "forward"]
    if rates.serial or not forward:
        dispatch = parts["ops"]["forward"] * rates.host_s_per_op
        return parts["forward"] + dispatch if rates.serial else max(parts["forward"], dispatch)
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
        per_op, per_step_op, random_per_s = measured["s_per_op"], measured["s_per_step_op"], measured["random_per_s"]
        if not flops or memory is None:
            flops, memory, host = {**measured["flops"], **flops}, memory or measured["memory_gbs"], None
            source = f"this CPU, measured at start-up ({measured['threads']} threads)"
    if memory is None:
        return None
    return Rates(flops=flops, memory_bytes_s=memory * GB, host_bytes_s=host * GB if host else None,
                 fp32_key="tf32" if compute_key == "tf32" else "fp32", source=source,
                 host_s_per_op=per_op * host_cost.relative(model_type), host_s_per_step_op=per_step_op,
                 kernel_min_s=KERNEL_MIN_S if on_gpu else 0.0, serial=not on_gpu, random_per_s=random_per_s,
                 traffic_hidden=not on_gpu, timed_products=source.startswith("this CPU"))


def step_time(traced: dict, setup, profile, pages_anew: bool = False, model_type: str | None = None,
              distributed=None) -> dict:
    """The predicted time of one optimizer step: on a GPU the host's launches of the ops and the device's
    kernels (queued_s: accumulation x a micro-batch's forward + backward, then the optimizer step); on a CPU
    the ops' sum; plus activation offload's host copies (save_on_cpu: each saved tensor to the host in forward
    and back in backward, over the host link) and what optimizer offload's copies add (host_copies.py). With its
    parts; `step_s` None with the reason where it cannot be predicted. `pages_anew`: the process hands freed host
    memory back to the OS (no malloc_reuse), so on a CPU the step's large tensors are paged in again each time they
    are made; `model_type`'s ops cost the host theirs; several processes (`distributed`) wait for collectives that
    outlast what they overlap (collectives_waited)."""
    rates = rates_of(profile, setup.techniques.precision.compute, model_type)
    if rates is None:
        return {"step_s": None, "why_not": f"profile {profile.name} has no memory_gbs (memory bandwidth)"}
    parts = seconds(traced["roofline_ops"], rates, traced.get("roofline_products") if rates.timed_products else None)
    accumulation = setup.accumulation_steps
    offloaded = traced.get("offloaded_bytes_per_micro_batch", 0)
    copies = host_copies.waited(traced, setup, rates.host_bytes_s, accumulation * parts["forward"],
                                accumulation * parts["backward"])  # optimizer offload's, over the host link
    if (offloaded or copies) and rates.host_bytes_s is None:
        return {"step_s": None, "why_not": f"profile {profile.name} has no host_link_gbs for offload's copies"}
    host_s = accumulation * 2 * offloaded / rates.host_bytes_s if offloaded else 0.0
    # the optimizer stepping on the host (adjust.py) runs no op on the device: its step is not timed
    on_device = not traced.get("optimizer_on_host")
    ops, micro_batch_s = parts["ops"]["forward"] + parts["ops"]["backward"], parts["forward"] + parts["backward"]
    accumulate_s = (accumulation - 1) * parts["accumulate"]  # each micro-batch after the first adds into the first's
    device_s = accumulation * micro_batch_s + accumulate_s + on_device * parts["step"]
    dispatch_s = host_calls_s(parts, traced, rates, model_type, accumulation, on_device)
    sequence = [op for op in traced.get("roofline_sequence") or [] if on_device or op[0] != "step"]
    pages_s, forward_pages_s = paged_in_s(traced, rates, pages_anew, accumulation, on_device)
    if rates.serial:
        queue_s = device_s + dispatch_s + pages_s
    else:
        queue_s = queued_s(sequence, rates, accumulation) if sequence and dispatch_s else max(device_s, dispatch_s)
    comm = collectives_waited(traced, setup, profile, distributed, accumulation * micro_batch_s)
    out = {"step_s": queue_s + host_s + comm.get("collectives_waited_s", 0.0) + copies.get("host_copies_waited_s", 0.0),
           "forward_s": parts["forward"], "backward_s": parts["backward"],
           "forward_only_s": forward_only_s(sequence, parts, rates) + forward_pages_s,
           "accumulate_s": accumulate_s,
           "optimizer_s": on_device * parts["step"], "host_transfer_s": host_s, "accumulation_steps": accumulation,
           "device_s": device_s, "dispatch_s": dispatch_s, "paged_in_s": pages_s,
           "idle_s": queue_s - device_s - pages_s,  # waiting for launches
           "bound": "host dispatch" if dispatch_s > device_s else "device",
           "ops_per_micro_batch": ops, "ops_accumulating": parts["ops"]["accumulate"],
           "ops_recomputed": traced.get("recomputed_ops", 0), "modules_walked": traced.get("modules", 0),
           "ops_in_optimizer_step": parts["ops"]["step"],
           "gpu_us_per_op": 1e6 * micro_batch_s / ops if ops else None,
           "compute_bound_share": parts["compute_bound_s"] / max(parts["compute_bound_s"] + parts["memory_bound_s"], 1e-30),
           "rates": rates.source, "method": "roofline per op (torch RuntimeEstimator), launched by the host",
           **comm, **copies}
    return noted(out, untimed(parts, traced, setup, profile, on_device), comm)


def paged_in_s(traced: dict, rates: Rates, pages_anew: bool, accumulation: int, on_device: bool) -> tuple[float, float]:
    """(a step's, a micro-batch's forward's) seconds paging in the large tensors it makes anew, on a CPU whose
    process hands freed memory back to the OS; a GPU's allocator caches its blocks."""
    paged = (traced.get("paged_in_bytes") or {}) if pages_anew and rates.serial else {}
    per_byte = peak.fresh_page_s() / peak.PAGE if any(paged.values()) else 0.0
    made = accumulation * (paged.get("forward", 0) + paged.get("backward", 0)) + on_device * paged.get("step", 0)
    return made * per_byte, paged.get("forward", 0) * per_byte


def noted(out: dict, left_out: dict, comm: dict) -> dict:
    """The step with what it cannot time (untimed) and one note of every part left out."""
    notes = [n for n in (left_out.get("note"), comm.get("note")) if n]
    return {**out, **left_out, **({"note": "; ".join(notes)} if notes else {})}


def host_calls_s(parts: dict, traced: dict, rates: Rates, model_type: str | None, accumulation: int,
                 on_device: bool) -> float:
    """The host's calls of a step's ops: each micro-batch's forward and backward ops at a model's op's cost,
    with checkpointing's hooks and Trainer's walks; the accumulating adds and the optimizer's ops at a bare
    call's (autograd's engine calls the adds from C++, without a module's Python)."""
    micro_batch = (parts["ops"]["forward"] + parts["ops"]["backward"]) * rates.host_s_per_op \
        + recompute_hooks_s(traced, rates, model_type) + trainer_walks_s(traced, rates)
    bare = (accumulation - 1) * parts["ops"]["accumulate"] + on_device * parts["ops"]["step"]
    return accumulation * micro_batch + bare * rates.host_s_per_step_op


def collectives_waited(traced: dict, setup, profile, distributed, compute_s: float) -> dict:
    """Several processes' collectives (collectives.py): the bytes each rank sends a step, their seconds over the
    ring's slowest link, and what the step waits for them beyond the `compute_s` they overlap; a note where
    no link is known (a CPU profile's processes, or nodes without a network bandwidth)."""
    sent = collectives.volume(setup, traced.get("total_params", 0), traced.get("trainable_params", 0))
    if not sent.total:
        return {}
    gbs, link = collectives.link_gbs(profile, distributed) if distributed is not None and profile.device == "cuda" \
        else (None, "no link bandwidth for this device")
    if gbs is None:
        return {"collective_bytes": sent.total, "note": f"the collectives of {setup.world_size} processes are not timed "
                                                        f"({link}): a lower bound"}
    took, waited = collectives.waited_s(sent, gbs * collectives.GB, compute_s)
    return {"collective_bytes": sent.total, "collectives_s": took, "collectives_waited_s": waited,
            "collectives_link": link}


def recompute_hooks_s(traced: dict, rates: Rates, model_type: str | None) -> float:
    """What activation checkpointing's hooks cost the host per micro-batch beyond the recomputed ops' own calls:
    on a CPU, each recomputed op (op_record.Roofline.recomputed) at what this CPU measured for one
    (peak.recomputed_op_s: MiniLM at 1 x 30 tokens took 21-23 ms longer a micro-batch checkpointed, its
    recomputed forward's ops and calls 12.5 ms of it), as a model's op costs the host relative to BERT's
    (host_cost.py). On a GPU profile not measured (no card here to measure it on): none."""
    recomputed = traced.get("recomputed_ops", 0)
    if not recomputed or not rates.serial:
        return 0.0
    return recomputed * peak.recomputed_op_s() * host_cost.relative(model_type)


def trainer_walks_s(traced: dict, rates: Rates) -> float:
    """What Trainer's own work costs the host per micro-batch: `model.train()` in its training_step and
    `floating_point_ops` (num_parameters) in its loop each walk every module of the model (the trace's count of
    them). On a CPU at what this CPU measured per module (peak.module_walk_s); on a GPU profile not measured (no
    card here, and the host walks while the device runs the queue the micro-batch before launched): none."""
    modules = traced.get("modules", 0)
    return modules * peak.module_walk_s() if modules and rates.serial else 0.0


def untimed(parts: dict, traced: dict, setup, profile, on_device: bool) -> dict:
    """What step_time cannot time: no step where a rate is missing, a note where part of the step is left out."""
    if parts["no_rate"]:
        return {"step_s": None, "why_not": f"profile {profile.name} has no peak rate for {', '.join(parts['no_rate'])}"}
    if not on_device:
        # the step on the host depends on the host's CPU and memory, which no profile describes; the GPU runs none
        return {"note": "the optimizer steps on the host's CPU: that step is not timed (a lower bound; the copies to "
                        "and from it are)"}
    return {}
