"""Activation bytes of the closed form: what one layer holds for backward, by the tensors they are, and
the moments of the forward and backward where the peak can fall. Each term names the tensors it
stands for; each was read off PyTorch's saved tensors and allocation timeline for a BERT layer
(fp32, autocast, CPU and CUDA kernels)."""
import math
from dataclasses import dataclass
from typing import Any

from ..config.schema import Config, is_on
from ..techniques import precision
from .inventory import Inventory


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


class NoClosedForm(Exception):
    """The closed form has no terms for this architecture; the message says which."""


def shape_of(config, job: Config, micro_batch: int) -> Shape:
    if getattr(config, "model_type", "") == "distilbert":
        return Shape(micro_batch, job.max_seq_len, config.dim, config.n_heads, config.hidden_dim, config.n_layers,
                     "distilbert", config.dropout, config.attention_dropout)
    if not hasattr(config, "hidden_dropout_prob"):  # BERT-style encoders (BERT, RoBERTa, ...) only
        raise NoClosedForm(f"no closed form for model_type {config.model_type!r} (BERT-style encoders, "
                           "Llama-family and GPT-2 decoders only)")
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
        """Bytes as the precision technique defines them (techniques/precision.py): under autocast the
        residual stream keeps the weights' dtype and matmul outputs are 16-bit."""
        t = precision.traits(job.precision.name)
        return Precision(param=t.param_bytes, hidden=t.param_bytes, matmul=t.compute_bytes, autocast=t.autocast)


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


def activations(inv: Inventory, sh: Shape, pr: Precision, job: Config, device: str,
                own_autocast: bool = False) -> dict[str, Any]:
    """`own_autocast`: memsweep applies autocast itself around the whole training step (the plan's
    autocast_dtype: fp16 on the CPU), not Accelerate around model.forward."""
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
    # memsweep's own autocast wraps the whole call (trainer.py)
    cache_at_end = weights if own_autocast else 0
    last_ln = T * h * pr.hidden  # the last dropout output, freed after the final LayerNorm
    incoming = T * h * pr.hidden  # the gradient arriving at a layer's output in backward
    # backward through the last FFN: the gradient of its T x intermediate activations while the
    # layer's saved tensors are still held
    ffn_grad = max(0, T * i * pr.matmul - T * h * pr.hidden)
    attn = attention_transient(sh, pr, device, attention, recording=True)
    moments: dict[str, int] = {}
    if n_recording and not is_on(job.checkpointing):
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
            "first_layer": first_layer if is_on(job.checkpointing) and n_recording else None}
