"""The closed form of the estimator: bytes per parameter and per activation, no tracing.

Inputs are the parameter inventory of the job's model (built on the meta device with the plan's
transforms: exact counts, dtypes, what is frozen or LoRA) and the architecture's hyperparameters.
Every term below names the tensors it stands for; each was read off PyTorch's saved tensors and
allocation timeline for a BERT layer (fp32, autocast, CPU and CUDA kernels), and the whole is
checked against the trace and against real jobs in tests/test_estimate.py.

Peak = the largest of the moments of the measured step (the ledger's step 2: optimizer state
exists), each = weights + buffers + optimizer state + what is alive then:
  forward   the last layer's attention (its transients) or its final LayerNorm (the last dropout
            output), with every saved activation; [gradients of earlier micro-batches]
  backward  the last FFN's gradients while its saved tensors are held; with checkpointing the
            recomputed last layer, and the first layer with every gradient above it made; with
            accumulation, a micro-batch's embedding gradient before it is added into .grad
  optimizer step   + all gradients + the optimizer's temporaries
"""
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

from ..config.schema import Config, HardwareConf, is_on
from ..techniques import optim as optim_traits
from . import decoder_moments
from .activations import Precision, Shape, activations, shape_of
from .decoder import DecoderShape, decoder_shape, weights_precision
from .inventory import Inventory, Tensor, layer_flops


def optimizer_state(inv: Inventory, optim: optim_traits.Traits, momentum: float, optim_bits: Optional[int]) -> int:
    trainable = [t for t in inv.params if t.trainable]
    if optim.bitsandbytes:
        total, maps = 0, 0
        for t in trainable:
            if t.embedding or t.numel < 4096 or optim_bits == 32:
                total += 8 * t.numel  # 32-bit states (Trainer keeps embeddings 32-bit)
            else:
                total += 2 * t.numel + 2 * math.ceil(t.numel / 256) * 4  # two uint8 states + block absmax
                maps = 2 * 256 * 4  # the two quantization maps, shared by every tensor
        return total + maps
    if optim.rule == "adamw":
        # exp_avg and exp_avg_sq in the parameter's dtype, a 4-byte step per tensor
        return sum(2 * t.numel * t.elem + 4 for t in trainable)
    if optim.rule == "sgd":
        return sum(t.numel * t.elem for t in trainable) if momentum else 0  # the momentum buffer
    if optim.rule == "adafactor":
        return sum(adafactor_state(t) for t in trainable)
    raise ValueError(f"no closed form for optimizer {optim!r}")


def adafactor_state(t: Tensor) -> int:
    # transformers' Adafactor: fp32 row and column second moments for a matrix, the full second
    # moment for a vector, plus an RMS scalar
    if len(t.shape) >= 2:
        rows = math.prod(t.shape[:-1])
        cols = math.prod(t.shape[:-2]) * t.shape[-1]
        return 4 * (rows + cols) + 4
    return 4 * t.numel + 4


def optimizer_temporaries(inv: Inventory, optim: optim_traits.Traits, device: str, weight_decay: float) -> int:
    """Bytes optimizer.step() allocates beyond its state, at its own peak."""
    trainable = [t for t in inv.params if t.trainable]
    if not trainable:
        return 0
    largest = max(t.numel for t in trainable)
    elem = max(t.elem for t in trainable)
    if optim.rule == "adamw" and not optim.fused and not optim.bitsandbytes:
        if device == "cuda":  # foreach: sqrt(exp_avg_sq) for a whole parameter group at once
            return max(sum(t.numel for t in trainable if t.decay), sum(t.numel for t in trainable if not t.decay)) * elem
        return 2 * largest * elem  # single tensor: sqrt(exp_avg_sq) and its division by the bias correction
    if optim.rule == "adafactor":
        return 2 * largest * 4  # the squared gradient and the update, in fp32
    if optim.rule == "sgd" and weight_decay:
        return largest * elem
    return 0  # sgd (in place), fused AdamW, bitsandbytes (in its own kernels)


@dataclass
class States:
    """Model and optimizer state bytes per process, and what the optimizer step allocates."""
    params: int
    grads: int
    optimizer: int
    temp: int  # the optimizer step's temporaries
    held: int = 0  # further buffers held through forward and backward (DeepSpeed's)
    at_step: int = 0  # further buffers held at the optimizer step only


def closed_form(inv: Inventory, config, job: Config, plan, profile: HardwareConf,
                optim_kwargs: Optional[dict] = None) -> dict[str, Any]:
    """The peak of the measured step and its breakdown, for the job's plan on the profile's device."""
    micro_batch, accumulation = plan.micro_batch_size, plan.accumulation_steps
    sh = decoder_shape(config, job, micro_batch) or shape_of(config, job, micro_batch)
    pr = Precision.of(job)
    if isinstance(sh, DecoderShape):
        pr = weights_precision(pr, inv)
    device = profile.device
    optim = optim_traits.traits(job.optim.hf_name)
    trainable = [t for t in inv.params if t.trainable]
    st = States(params=sum(t.nbytes for t in inv.params), grads=sum(t.numel * t.elem for t in trainable),
                optimizer=optimizer_state(inv, optim, job.optim.momentum, (optim_kwargs or {}).get("optim_bits")),
                temp=optimizer_temporaries(inv, optim, device, job.optim.weight_decay))
    notes: list[str] = []
    if is_on(job.deepspeed):
        st, pr = deepspeed_states(st, inv, job, profile, pr, plan.nproc)
        notes.append("DeepSpeed (closed form only): ZeRO's per-process states with DeepSpeed's flat fp32 "
                     "buffers; checked on one CPU process, not on GPUs or several processes")
    if isinstance(sh, DecoderShape):
        quantize = job.lora.quantize.value if is_on(job.lora) else "none"
        act = decoder_moments.activations(inv, sh, pr, job, device, quantize)
    else:
        act = activations(inv, sh, pr, job, device, own_autocast=plan.autocast_dtype is not None)
    if is_on(job.offload) and device == "cuda":
        # save_on_cpu: saved tensors go to host memory; a layer's working set stays on the device
        per_layer = sum(act["per_layer"].values())
        act = {**act, "saved": 0, "moments": {k: min(v, 2 * per_layer) for k, v in act["moments"].items()}}
        notes.append("offload=activations: saved tensors counted in host memory, not on the device")

    buffers = inv.buffers_bytes
    grads_alive = st.grads if accumulation > 1 else 0  # earlier micro-batches' gradients
    base = st.params + buffers + st.optimizer + st.held
    # each moment as (gradients alive, activations, temporaries) on top of the weights and state
    parts = {name: (grads_alive, value, 0) for name, value in act["moments"].items()}
    for name, (made, value, in_flight) in act.get("backward", {}).items():
        # (a decoder's) moments with the gradients made so far; with accumulation all of them exist
        parts[name] = (st.grads if accumulation > 1 else made, value, in_flight)
    parts["optimizer step"] = (st.grads, 0, st.temp + st.at_step)
    if act.get("first_layer") is not None and accumulation == 1:
        # recomputing the first layer, with the gradients of every layer above it and of the head made
        above = sum(t.numel * t.elem for t in trainable
                    if (t.layer or 0) > 0 or (t.layer is None and "embeddings" not in t.name))
        parts["backward: first layer"] = (above, act["first_layer"], 0)
    if accumulation > 1 and trainable:
        # a later micro-batch's gradient of the largest parameter (the word embeddings) is made whole,
        # then added into the .grad already there
        parts["backward: accumulate"] = (st.grads, 0, max(t.numel * t.elem for t in trainable))
    moments = {name: base + sum(p) for name, p in parts.items()}
    phase = max(moments, key=moments.get)
    grads_at, act_at, temp_at = parts[phase]
    breakdown = {"params": st.params, "buffers": buffers, "grads": grads_at, "optimizer": st.optimizer,
                 "activations": act_at, "temp": temp_at + st.held}
    return {
        "peak_bytes": moments[phase],
        "breakdown": breakdown,
        "phase": phase,
        "moments": moments,
        "activations_bytes": act["saved"],
        "activations_per_layer": act["per_layer"],
        "grads_bytes": st.grads,
        "optimizer_bytes": st.optimizer,
        "optimizer_temp_bytes": st.temp,
        "flops_per_step": (decoder_moments.flops(inv, sh, job) if isinstance(sh, DecoderShape)
                           else flops(inv, sh, job)) * accumulation,
        "notes": notes,
    }


def deepspeed_states(st: States, inv: Inventory, job: Config, profile: HardwareConf,
                     pr: Precision, nproc: int) -> tuple[States, Precision]:
    """ZeRO stage 0-3 per process (N = nproc): stage >= 1 partitions the optimizer state and
    its fp32 master weights, >= 2 the gradients, 3 the weights. DeepSpeed steps the client optimizer
    on one flat fp32 partition, so a single-tensor AdamW's two temporaries span all of it (a foreach
    one on a GPU: one). With bf16/fp16 DeepSpeed casts the model itself: weights, gradients and
    activations are 16-bit (no autocast), the fp32 master weights live with the optimizer."""
    n, stage = max(1, nproc), job.deepspeed.stage
    psi = sum(t.numel for t in inv.params if t.trainable)
    every = sum(t.numel for t in inv.params)
    mixed = pr.autocast
    if not mixed and stage == 0:
        return st, pr  # plain fp32 training under the engine
    n1, n2, n3 = (n if stage >= k else 1 for k in (1, 2, 3))
    flat = (4 * psi) // n1  # the flat fp32 partition the optimizer steps
    temp = flat if profile.device == "cuda" else 2 * flat
    off_host = profile.device != "cpu"  # offloading to the host changes nothing when the device is the host
    offload_opt = job.deepspeed.offload_optimizer and off_host
    if mixed:
        # the fp32 master weights: measured (one CPU process) to count at the optimizer step only
        states = States(params=2 * every // n3, grads=2 * psi // n2, optimizer=st.optimizer // n1, temp=temp,
                        at_step=flat)
        pr = Precision(param=2, hidden=2, matmul=2, autocast=False)
    else:
        states = States(params=4 * every // n3, grads=4 * psi // n2, optimizer=st.optimizer // n1, temp=temp,
                        held=(4 * psi) // n2 if stage >= 2 else 0,  # the fp32 gradient partition, from backward on
                        at_step=4 * psi if stage == 1 else 0)  # stage 1: the flat gradient copy
    if offload_opt:  # the optimizer state, master weights and their step run on the host
        states = dataclasses.replace(states, optimizer=0, temp=0, at_step=0 if mixed else states.at_step)
    if job.deepspeed.offload_param and stage >= 3 and off_host:
        states = dataclasses.replace(states, params=0)
    return states, pr


def flops(inv: Inventory, sh: Shape, job: Config) -> int:
    """Matmul FLOPs of one micro-batch's forward and backward (2 per multiply-add); the head runs on
    one (pooled) token per sequence."""
    total = layer_flops(inv, sh.micro_batch, sh.seq_len, sh.hidden, is_on(job.checkpointing))
    head = 2 * sh.micro_batch * inv.head_linear_weights
    return total + head * 3
