"""The closed-form memory model of estimate.py: bytes per parameter and per activation, no tracing.

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
from dataclasses import dataclass, field
from typing import Any, Optional

from .schema import Config, HardwareConf, PrecisionName


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


def _layer_index(name: str, layers_module: str) -> Optional[int]:
    prefix = layers_module.split(".")[-1] + "."
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == prefix[:-1] and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def inventory(model, job: Config) -> Inventory:
    """The parameter inventory of a model built on the meta device (see estimate.meta_model)."""
    import torch
    from transformers import Trainer

    decay = set(Trainer.get_decay_parameter_names(None, model))  # Trainer's own grouping; `self` unused
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    quantize = job.lora.quantize.value if job.lora.enabled else "none"
    skip = list(job.model.quantize_skip_modules)
    params, seen = [], set()
    layers = None
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        layer = _layer_index(name, job.model.layers_module)
        if layer is not None:
            layers = max(layers or 0, layer + 1)
        nbytes = p.numel() * p.element_size()
        if quantize != "none" and _quantized(name, p, skip):
            nbytes = quantized_bytes(p, quantize)
        params.append(Tensor(name, tuple(p.shape), p.element_size(), nbytes, p.requires_grad, id(p) in embeddings,
                             name in decay, layer))
    layers = layers or 0
    trainable_layers = [any(t.trainable for t in params if t.layer == i) for i in range(layers)]
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
               and "lora_" not in n and "modules_to_save" not in n]
    layer0 = [m.weight for n, m in linears if _layer_index(n + ".weight", job.model.layers_module) == 0]
    head = [m.weight for n, m in linears if _layer_index(n + ".weight", job.model.layers_module) is None]
    lora_modules = [n for n, m in model.named_modules() if n.endswith("lora_A") and len(list(m.children()))]
    lora_in_layer0 = [n for n in lora_modules if _layer_index(n + ".x", job.model.layers_module) == 0]
    return Inventory(
        params=params,
        buffers_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        linear_weights_per_layer=sum(w.numel() for w in layer0),
        head_linear_weights=sum(w.numel() for w in head),
        trainable_linear_weights_per_layer=sum(w.numel() for w in layer0 if w.requires_grad),
        trainable_head_linear_weights=sum(w.numel() for w in head if w.requires_grad),
        trainable_layers=trainable_layers,
        embeddings_trainable=any(t.trainable for t in params if t.layer is None and "embeddings" in t.name),
        lora_rank=job.lora.r if job.lora.enabled else 0,
        lora_modules_per_layer=len(lora_in_layer0),
    )


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


# --- pieces --------------------------------------------------------------------------------------

@dataclass
class Shape:
    micro_batch: int
    seq_len: int
    hidden: int
    heads: int
    intermediate: int
    layers: int
    architecture: str
    hidden_dropout: float
    attention_dropout: float


def shape_of(config, job: Config, micro_batch: int) -> Shape:
    if job.model.architecture == "distilbert" or getattr(config, "model_type", "") == "distilbert":
        return Shape(micro_batch, job.max_seq_len, config.dim, config.n_heads, config.hidden_dim, config.n_layers,
                     "distilbert", config.dropout, config.attention_dropout)
    return Shape(micro_batch, job.max_seq_len, config.hidden_size, config.num_attention_heads,
                 config.intermediate_size, config.num_hidden_layers, "bert", config.hidden_dropout_prob,
                 config.attention_probs_dropout_prob)


@dataclass
class Precision:
    param: int  # bytes of a parameter value
    hidden: int  # residual stream and LayerNorm in/out
    matmul: int  # outputs of Linear / attention
    autocast: bool

    @staticmethod
    def of(job: Config) -> "Precision":
        name = PrecisionName(job.precision.name)
        if name == PrecisionName.bf16_true:
            return Precision(param=2, hidden=2, matmul=2, autocast=False)
        if name in (PrecisionName.bf16, PrecisionName.fp16):
            return Precision(param=4, hidden=4, matmul=2, autocast=True)
        return Precision(param=4, hidden=4, matmul=4, autocast=False)


ATTENTION_TERMS = ("qkv input", "attention q k v", "attention s x s", "attention q k v out", "attention logsumexp",
                   "attention bias", "lora")  # held once a layer's attention has run


def math_attention(sh: Shape, device: str, attention: str) -> bool:
    """CPU SDPA runs its math path when training with dropout; eager attention is always explicit."""
    return attention == "eager" or (device != "cuda" and sh.attention_dropout > 0)


def layer_activations(sh: Shape, pr: Precision, device: str, attention: str, lora_rank: int, lora_modules: int,
                      lora_dropout: float, frozen_weights: bool) -> dict[str, int]:
    """Bytes one encoder layer holds for backward, by the tensors they are."""
    b, s, h, i, a = sh.micro_batch, sh.seq_len, sh.hidden, sh.intermediate, sh.heads
    T = b * s
    cuda = device == "cuda"

    def mask(nbytes, p):  # dropout keeps its mask: CUDA a bool, the CPU a float of the input's dtype
        return 0 if p == 0 else T * h * (1 if cuda else nbytes)

    terms: dict[str, int] = {}
    keeps_inputs = not frozen_weights  # a frozen Linear needs no input for its (absent) weight gradient
    if keeps_inputs:
        # q/k/v: autocast casts the layer input once per Linear; fp32 saves the input itself, shared
        terms["qkv input"] = 3 * T * h * 2 if pr.autocast else T * h * pr.hidden
    if attention == "eager":
        # q, k, v kept; scores after softmax, the dropout mask and its output: s x s per head
        terms["attention q k v"] = 3 * T * h * pr.matmul
        terms["attention s x s"] = b * a * s * s * pr.matmul * (3 if sh.attention_dropout else 1)
    elif math_attention(sh, device, attention):
        # CPU SDPA with dropout runs the math path, upcast to fp32: q*scale, k^T, v, and three s x s
        # tensors (softmax output, dropout mask, dropped probabilities)
        terms["attention q k v"] = 3 * T * h * 4
        terms["attention s x s"] = 3 * b * a * s * s * 4
    else:
        # CUDA memory-efficient kernel / CPU flash: q, k, v, the output (which the dense layer then
        # reads as a view) and the log-sum-exp; the float attention bias made from the padding mask
        terms["attention q k v out"] = 4 * T * h * pr.matmul
        terms["attention logsumexp"] = b * a * (math.ceil(s / 32) * 32 if cuda else s) * 4
        terms["attention bias"] = b * s * s * (pr.matmul if cuda else 4)
    if lora_rank:
        # per adapted Linear: lora_dropout's mask and output (the adapter's input), and the rank-r hidden
        terms["lora"] = lora_modules * (mask(pr.hidden, lora_dropout) + T * h * pr.hidden + T * lora_rank * pr.matmul)
    if keeps_inputs and "attention q k v out" not in terms:
        terms["attention output (dense input)"] = T * h * pr.matmul
    if sh.architecture == "bert":
        terms["attention dropout mask"] = mask(pr.matmul, sh.hidden_dropout)
    terms["layernorm inputs + stats"] = 2 * (T * h * pr.hidden + 2 * T * 4)
    if keeps_inputs:
        terms["ffn input"] = T * h * (2 if pr.autocast else pr.hidden)
        terms["ffn gelu output (fc2 input)"] = T * i * pr.matmul
    terms["ffn gelu input"] = T * i * pr.matmul
    terms["ffn dropout mask"] = mask(pr.matmul, sh.hidden_dropout)
    return terms


def attention_transient(sh: Shape, pr: Precision, device: str, attention: str, recording: bool) -> int:
    """What a layer's attention holds while it runs, beyond what it keeps for backward."""
    b, s, h, a = sh.micro_batch, sh.seq_len, sh.hidden, sh.heads
    T = b * s
    if not math_attention(sh, device, attention):
        return 0 if recording else 4 * T * h * pr.matmul
    upcast = 4 if attention != "eager" else pr.matmul  # the CPU math path computes in fp32
    mask = b * s * s * 4  # the float copy of the padding mask
    if not recording:  # no autograd: q, k, v, their scaled copies and three s x s tensors at once
        return mask + 3 * T * h * pr.matmul + 3 * T * h * upcast + 3 * b * a * s * s * upcast
    # two s x s score tensors (before and after masking); in reduced precision the fp32 q, k, v
    return mask + 2 * b * a * s * s * upcast + (3 * T * h * 4 if pr.matmul < 4 and upcast == 4 else 0)


def autocast_weight_copies(inv: Inventory, pr: Precision, layers: int) -> int:
    """Autocast keeps a 16-bit copy of every trainable Linear weight it casts until the forward ends."""
    if not pr.autocast:
        return 0
    return 2 * (inv.trainable_linear_weights_per_layer * layers + inv.trainable_head_linear_weights)


def activations(inv: Inventory, sh: Shape, pr: Precision, job: Config, device: str) -> dict[str, Any]:
    """Activation bytes at the moments of the forward and backward where the peak can fall."""
    T, h, i = sh.micro_batch * sh.seq_len, sh.hidden, sh.intermediate
    attention = job.attention.implementation.value
    # A layer records nothing for backward when nothing below it (and nothing in it) trains.
    recording = []
    upstream = inv.embeddings_trainable
    for layer_trains in inv.trainable_layers:
        upstream = upstream or layer_trains
        recording.append(upstream)
    frozen_weights = inv.lora_rank > 0 or not any(inv.trainable_layers)
    layer = layer_activations(sh, pr, device, attention, inv.lora_rank, inv.lora_modules_per_layer, job.lora.dropout,
                              frozen_weights)
    per_layer = sum(layer.values())
    after_attention = sum(v for k, v in layer.items() if k not in ATTENTION_TERMS)
    n_recording = sum(recording)
    emb = 0
    if inv.embeddings_trainable:  # LayerNorm input + stats, dropout mask
        emb = T * h * pr.hidden + 2 * T * 4 + (0 if sh.hidden_dropout == 0 else T * h * (1 if device == "cuda" else pr.hidden))
    if upstream:
        # fp32: the pooler's [:, 0] view keeps the whole last hidden state; autocast casts the slice
        head = (T * h * pr.hidden if not pr.autocast else 2 * sh.micro_batch * h) + 4 * sh.micro_batch * h * 4
    else:  # only the classifier trains: its input and dropout mask
        head = 2 * sh.micro_batch * h * 4 if any(t.trainable for t in inv.params) else 0
    layer_weights = 2 * inv.trainable_linear_weights_per_layer if pr.autocast else 0
    weights = autocast_weight_copies(inv, pr, n_recording)
    # Accelerate's autocast wraps model.forward: its weight cache is gone when the forward's hooks run;
    # memsweep's own fp16 autocast on the CPU wraps the whole call (trainer.py)
    cache_at_end = weights if PrecisionName(job.precision.name) == PrecisionName.fp16 and device == "cpu" else 0
    last_ln = T * h * pr.hidden  # the last dropout output, freed after the final LayerNorm
    incoming = T * h * pr.hidden  # the gradient arriving at a layer's output in backward
    # backward through the last FFN: the gradient of its T x intermediate activations while the
    # layer's saved tensors are still held
    ffn_grad = max(0, T * i * pr.matmul - T * h * pr.hidden)
    attn = attention_transient(sh, pr, device, attention, recording=True)
    moments: dict[str, int] = {}
    if n_recording and not job.checkpointing.enabled:
        saved = emb + n_recording * per_layer + head + weights
        moments["forward: last attention"] = saved - after_attention - head + attn
        moments["forward: last layernorm"] = saved + last_ln
        moments["backward: last FFN"] = saved + ffn_grad
    elif n_recording:
        # each checkpointed layer keeps only its input; backward recomputes the last layer first,
        # after autocast has dropped its weight cache
        # (and the boolean padding mask, an input of every checkpointed layer)
        held = emb + n_recording * T * h * pr.hidden + sh.micro_batch * sh.seq_len ** 2 + head
        saved = held + cache_at_end
        moments["forward: last layer"] = held + weights + last_ln
        recomputed = held + incoming + per_layer + layer_weights
        moments["backward: recompute attention"] = recomputed - after_attention + attn
        moments["backward: recompute layernorm"] = recomputed + last_ln
        moments["backward: last FFN"] = recomputed + ffn_grad
        # the first layer, last in backward: only its own input and the embeddings' tensors remain
        first_layer = emb + T * h * pr.hidden + sh.micro_batch * sh.seq_len ** 2 + incoming + per_layer \
            + layer_weights + ffn_grad
    else:
        saved = head
        moments["forward end"] = saved
    if n_recording < sh.layers:  # layers running without autograd: only their working set
        moments["forward: frozen layer"] = emb + attention_transient(sh, pr, device, attention, recording=False)
    return {"saved": saved, "moments": moments, "per_layer": layer,
            "first_layer": first_layer if job.checkpointing.enabled and n_recording else None}


def optimizer_state(inv: Inventory, optim: str, momentum: float, optim_bits: Optional[int]) -> int:
    trainable = [t for t in inv.params if t.trainable]
    if optim in ("adamw_torch", "adamw_torch_fused"):
        # exp_avg and exp_avg_sq in the parameter's dtype, a 4-byte step per tensor
        return sum(2 * t.numel * t.elem + 4 for t in trainable)
    if optim == "sgd":
        return sum(t.numel * t.elem for t in trainable) if momentum else 0  # the momentum buffer
    if optim == "adafactor":
        return sum(adafactor_state(t) for t in trainable)
    if optim in ("adamw_bnb_8bit", "paged_adamw_8bit"):
        total, maps = 0, 0
        for t in trainable:
            if t.embedding or t.numel < 4096 or optim_bits == 32:
                total += 8 * t.numel  # 32-bit states (Trainer keeps embeddings 32-bit)
            else:
                total += 2 * t.numel + 2 * math.ceil(t.numel / 256) * 4  # two uint8 states + block absmax
                maps = 2 * 256 * 4  # the two quantization maps, shared by every tensor
        return total + maps
    raise ValueError(f"no closed form for optimizer {optim!r}")


def adafactor_state(t: Tensor) -> int:
    # transformers' Adafactor: fp32 row and column second moments for a matrix, the full second
    # moment for a vector, plus an RMS scalar
    if len(t.shape) >= 2:
        rows = math.prod(t.shape[:-1])
        cols = math.prod(t.shape[:-2]) * t.shape[-1]
        return 4 * (rows + cols) + 4
    return 4 * t.numel + 4


def optimizer_temporaries(inv: Inventory, optim: str, device: str, weight_decay: float) -> int:
    """Bytes optimizer.step() allocates beyond its state, at its own peak."""
    trainable = [t for t in inv.params if t.trainable]
    if not trainable:
        return 0
    largest = max(t.numel for t in trainable)
    elem = max(t.elem for t in trainable)
    if optim == "adamw_torch":
        if device == "cuda":  # foreach: sqrt(exp_avg_sq) for a whole parameter group at once
            return max(sum(t.numel for t in trainable if t.decay), sum(t.numel for t in trainable if not t.decay)) * elem
        return 2 * largest * elem  # single tensor: sqrt(exp_avg_sq) and its division by the bias correction
    if optim == "adafactor":
        return 2 * largest * 4  # the squared gradient and the update, in fp32
    if optim == "sgd" and weight_decay:
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


def closed_form(inv: Inventory, config, job: Config, profile: HardwareConf, micro_batch: int, accumulation: int,
                optim_kwargs: Optional[dict] = None) -> dict[str, Any]:
    sh = shape_of(config, job, micro_batch)
    pr = Precision.of(job)
    device = profile.device
    optim = job.optim.hf_name.value
    trainable = [t for t in inv.params if t.trainable]
    st = States(params=sum(t.nbytes for t in inv.params), grads=sum(t.numel * t.elem for t in trainable),
                optimizer=optimizer_state(inv, optim, job.optim.momentum, (optim_kwargs or {}).get("optim_bits")),
                temp=optimizer_temporaries(inv, optim, device, job.optim.weight_decay))
    notes: list[str] = []
    if job.deepspeed.stage is not None:
        st, pr = deepspeed_states(st, inv, job, profile, pr)
        notes.append("DeepSpeed (closed form only): ZeRO's per-process states with DeepSpeed's flat fp32 "
                     "buffers; checked on one CPU process, not on GPUs or several processes")
    act = activations(inv, sh, pr, job, device)
    if job.offload.activations and device == "cuda":
        # save_on_cpu: saved tensors go to host memory; a layer's working set stays on the device
        per_layer = sum(act["per_layer"].values())
        act = {**act, "saved": 0, "moments": {k: min(v, 2 * per_layer) for k, v in act["moments"].items()}}
        notes.append("offload=activations: saved tensors counted in host memory, not on the device")

    buffers = inv.buffers_bytes
    grads_alive = st.grads if accumulation > 1 else 0  # earlier micro-batches' gradients
    base = st.params + buffers + st.optimizer + st.held
    # each moment as (gradients alive, activations, temporaries) on top of the weights and state
    parts = {name: (grads_alive, value, 0) for name, value in act["moments"].items()}
    parts["optimizer step"] = (st.grads, 0, st.temp + st.at_step)
    if act["first_layer"] is not None and accumulation == 1:
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
        "flops_per_step": flops(inv, sh, job) * accumulation,
        "notes": notes,
    }


def deepspeed_states(st: States, inv: Inventory, job: Config, profile: HardwareConf,
                     pr: Precision) -> tuple[States, Precision]:
    """ZeRO stage 0-3 per process (N = distributed.nproc): stage >= 1 partitions the optimizer state and
    its fp32 master weights, >= 2 the gradients, 3 the weights. DeepSpeed steps the client optimizer
    on one flat fp32 partition, so a single-tensor AdamW's two temporaries span all of it (a foreach
    one on a GPU: one). With bf16/fp16 DeepSpeed casts the model itself: weights, gradients and
    activations are 16-bit (no autocast), the fp32 master weights live with the optimizer."""
    n, stage = max(1, job.distributed.nproc), job.deepspeed.stage
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
    """Matmul FLOPs of one micro-batch's forward and backward (2 per multiply-add)."""
    T, s, h = sh.micro_batch * sh.seq_len, sh.seq_len, sh.hidden
    linear = 2 * T * inv.linear_weights_per_layer
    attention = 2 * 2 * sh.micro_batch * s * s * h  # q @ k^T and probabilities @ v
    trains_weights = not inv.lora_rank
    total, upstream = 0, inv.embeddings_trainable
    for layer_trains in inv.trainable_layers:
        recording = upstream or layer_trains
        total += linear + attention
        if recording:
            # gradients of the inputs (unless nothing below needs them) and of trainable weights;
            # attention has no weights: two matmuls back for each forward one
            total += linear * ((1 if upstream else 0) + (1 if trains_weights and layer_trains else 0)) + 2 * attention
            if job.checkpointing.enabled:
                total += linear + attention  # recomputed
        upstream = recording
    head = 2 * sh.micro_batch * inv.head_linear_weights
    return total + head * 3


__all__ = ["inventory", "closed_form", "Inventory", "field"]
