"""The closed form's activations for a decoder LLM (decoder.py has its layers): the embeddings', the
head's and the loss's tensors, and the moments of the measured step where the peak can fall.

The causal-LM head computes logits for every token (b x s x vocab, in the compute dtype); the loss
(transformers' ForCausalLMLoss) upcasts them to fp32 and runs cross_entropy, whose log_softmax output is
kept for backward; in backward nll_loss and log_softmax each make a b x s x vocab fp32 gradient. With a
large vocabulary these are often the peak. Moments, each what is alive then (on top of weights,
buffers and optimizer state; closed_form.py adds the optimizer step):
  forward: loss            every saved tensor, the logits and their fp32 copy, log_softmax's output
  backward: loss           every saved tensor, log_softmax's output and the two fp32 gradients
  backward: lm_head        the logits' gradient and the head's weight gradient (16-bit, then fp32)
  backward: last / first layer   a layer's backward (recomputed under checkpointing) with the
                           gradients made above it: linear in depth, so its extremes are the ends
  backward: embeddings     every gradient, the embedding's being made (a tied head's share held by
                           autograd until the embedding's is added to it, out of place)
"""
from typing import Any

from ..config.schema import Config, is_on
from .activations import Precision
from .decoder import DecoderShape, Layer, backward_transient, casts, checkpoint_shared, kv_cache, layer_activations, mask_bytes
from .inventory import Inventory, layer_flops


def model_terms(inv: Inventory, sh: DecoderShape, pr: Precision, device: str, recording: bool) -> dict[str, int]:
    """Tensors kept once per model, outside the layers."""
    T, s = sh.tokens, sh.seq_len
    terms = {"causal mask": sh.micro_batch * s * s}  # bool, an input of every layer (checkpointed ones keep it)
    if inv.embeddings_trainable:  # the ids (and GPT-2's positions), for the embeddings' gradients
        terms["input ids"] = T * 8 + (s * 8 if sh.architecture == "gpt2" else 0)
        if sh.embedding_dropout:
            terms["embedding dropout mask"] = mask_bytes(device, pr.hidden) * T * sh.hidden
    if recording and sh.architecture == "llama":
        # rotary cos and sin, made once in the embeddings' dtype and kept by every layer's multiplies
        terms["rotary cos, sin"] = 2 * s * sh.head_dim * pr.hidden
    return terms


def head_terms(inv: Inventory, sh: DecoderShape, pr: Precision, recording: bool, norm_trains: bool) -> dict[str, int]:
    """The final norm, the head's input (or, frozen under autocast, its weight's 16-bit cast) and the loss's."""
    T, h, V = sh.tokens, sh.hidden, sh.vocab
    head_trains = inv.trainable_head_linear_weights > 0
    terms = {}
    if recording:
        if sh.architecture == "llama":  # RMSNorm: fp32 input, rsqrt, the normalised input for its weight
            terms["final norm"] = T * h * 4 + T * 4 + (T * h * pr.hidden if norm_trains else 0)
        else:  # LayerNorm: input, mean, rstd
            terms["final norm"] = T * h * pr.hidden + 2 * T * 4
    if head_trains:
        terms["head input"] = T * h * (pr.matmul if casts(pr) else pr.hidden)
    elif recording and casts(pr) and sh.causal_lm:
        terms["head weight cast"] = V * h * pr.matmul  # a frozen weight's cast, kept for the input's gradient
    if sh.causal_lm:
        terms["log_softmax (fp32)"] = T * V * 4
        terms["labels"] = T * 8
    return terms


def grads_by_place(inv: Inventory) -> tuple[list[int], int, int]:
    """Gradient bytes (fp32 or the parameter's dtype) per layer, of the embeddings, and of the rest (head, final norm)."""
    per_layer = [0] * len(inv.trainable_layers)
    embeddings = rest = 0
    for t in inv.params:
        if not t.trainable:
            continue
        nbytes = t.numel * t.elem
        if t.layer is not None:
            per_layer[t.layer] += nbytes
        elif t.embedding:
            embeddings += nbytes
        else:
            rest += nbytes
    return per_layer, embeddings, rest


def activations(inv: Inventory, sh: DecoderShape, pr: Precision, job: Config, device: str,
                quantize: str = "none") -> dict[str, Any]:
    """Activation bytes at the moments of the step where the peak can fall (`backward`: moments where
    gradients exist, as (gradient bytes made, activation bytes, bytes in flight))."""
    T, h, V = sh.tokens, sh.hidden, sh.vocab
    attention = job.attention.implementation.value
    lora = inv.lora_rank
    lora_bytes = next((t.elem for t in inv.params if "lora_" in t.name), pr.hidden)
    layers, upstream = [], inv.embeddings_trainable
    for trains in inv.trainable_layers:
        full = trains and not lora
        ly = Layer(trainable=full, grad_in=upstream, lora_rank=lora if trains else 0,
                   lora_modules=inv.lora_modules_per_layer, lora_dropout=job.lora.dropout, lora_bytes=lora_bytes,
                   frozen_linear_weights=0 if full else inv.linear_weights_per_layer, quantize=quantize)
        layers.append((ly, layer_activations(sh, pr, device, attention, ly)))
        upstream = upstream or trains
    recorded = [(ly, terms) for ly, terms in layers if terms]
    first_index = next((n for n, (_, terms) in enumerate(layers) if terms), 0)
    full_ft = any(ly.trainable for ly, _ in layers)
    model = model_terms(inv, sh, pr, device, bool(recorded))
    head = head_terms(inv, sh, pr, upstream, full_ft)
    # autocast's 16-bit casts of trainable weights: a layer's kept by its matmuls until its backward,
    # the head's likewise; all cached until the forward (with the loss) ends
    def layer_weights(ly: Layer) -> int:
        return inv.linear_weights_per_layer * pr.matmul if casts(pr) and ly.trainable else 0

    head_weight = inv.trainable_head_linear_weights * pr.matmul if casts(pr) else 0
    all_layer_weights = sum(layer_weights(ly) for ly, _ in recorded)
    # the logits in the head's dtype (every token's), and the fp32 copy the loss makes and keeps
    logits, fp32 = (T * V * pr.matmul, T * V * 4) if sh.causal_lm else (0, 0)
    # a bitsandbytes weight dequantized (to its original dtype) for a matmul, and that cast to the fp32
    # the layer computes in (memsweep's bnb_4bit_compute_dtype; LLM.int8 casts to its input's dtype)
    dequantized = max((t.numel * (t.elem + (4 if t.elem < 4 else 0)) for t in inv.params
                       if quantize != "none" and t.nbytes < t.numel * t.elem), default=0)

    per_layer = [sum(terms.values()) for _, terms in recorded]
    if is_on(job.checkpointing):  # each checkpointed layer keeps only its input (the mask is in `model`)
        kept = len(recorded) * T * h * pr.hidden
        layer_held, casts_until_end = 0, all_layer_weights
    else:
        kept = sum(per_layer)
        layer_held, casts_until_end = all_layer_weights, 0
    saved = sum(model.values()) + kept + sum(head.values()) + layer_held + head_weight
    # the KV cache and the last hidden state (the final norm's output, unless it is the head's kept
    # input) are the model's outputs until its forward returns
    last_hidden = 0 if inv.trainable_head_linear_weights and not casts(pr) else T * h * pr.hidden
    forward_end = saved + casts_until_end + kv_cache(sh, pr, attention, device) + last_hidden
    moments: dict[str, int] = {}
    backward: dict[str, tuple[int, int, int]] = {}
    if not sh.causal_lm:
        moments["forward: end"] = forward_end
    else:
        # the logits and their fp32 copy (ForCausalLMLoss's .float(), or Accelerate's fp32 outputs under
        # autocast) while log_softmax's output is made; in fp32 the logits are that copy
        moments["forward: loss"] = forward_end + logits + (fp32 if pr.matmul < 4 else 0)
        moments["backward: loss"] = saved + 2 * fp32  # nll_loss's and log_softmax's gradients
        # the logits' gradient in the head's dtype, the input's and the weight's; under autocast the
        # weight's 16-bit gradient is then cast to fp32 once the weight's cast is freed
        head_grad = V * h * pr.matmul if inv.trainable_head_linear_weights else 0
        first = logits + T * h * pr.matmul + head_grad
        second = V * h * 4 if head_grad and casts(pr) else 0
        backward["backward: lm_head"] = (0, saved - fp32 - T * 8, max(first, second))
    if not recorded:
        return {"saved": saved, "moments": moments, "backward": backward, "per_layer": {}}

    grads, emb_grads, head_grads = grads_by_place(inv)
    # a tied head's share of the embedding's gradient, held by autograd until the embedding's is added
    tied = V * h * pr.param if inv.tied_head and inv.trainable_head_linear_weights else 0
    last_ly, last = recorded[-1]
    first_ly, first_terms = recorded[0]
    # a layer's backward with the layers' tensors still kept below it; under checkpointing it recomputes
    # the layer (its tensors and its weights' casts) while the checkpointed inputs are kept
    last_act = sum(model.values()) + kept + layer_held
    first_act = sum(model.values()) + sum(first_terms.values()) + layer_weights(first_ly)
    if is_on(job.checkpointing):
        last_act += sum(last.values()) + layer_weights(last_ly) - checkpoint_shared(sh, pr, last_ly)
        first_act += T * h * pr.hidden - checkpoint_shared(sh, pr, first_ly)
    backward["backward: last layer"] = (head_grads, last_act + backward_transient(sh, pr, last_ly, dequantized), tied)
    backward["backward: first layer"] = (head_grads + sum(grads[first_index + 1:]),
                                         first_act + backward_transient(sh, pr, first_ly, dequantized), tied)
    if emb_grads:
        # the embedding's dense gradient; a tied one is added to the head's share out of place
        backward["backward: embeddings"] = (head_grads + sum(grads), 0, emb_grads + 2 * tied)
    return {"saved": saved, "moments": moments, "backward": backward, "per_layer": last}


def flops(inv: Inventory, sh: DecoderShape, job: Config) -> int:
    """Matmul FLOPs of one micro-batch's forward and backward (2 per multiply-add); the head runs on every token."""
    T = sh.tokens
    total = layer_flops(inv, sh.micro_batch, sh.seq_len, sh.q_width, is_on(job.checkpointing))
    head = 2 * T * inv.head_linear_weights
    return total + head * (3 if inv.trainable_head_linear_weights else 2)
