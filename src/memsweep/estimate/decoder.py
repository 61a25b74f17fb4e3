"""Activation bytes of the closed form for decoder LLMs, by the tensors they are: the Llama family
(llama, mistral, qwen2: RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention, optional q/k/v
bias) and GPT-2 (LayerNorm, GELU MLP, learned positions, fused q/k/v Conv1D, dropout).

Each term was read off the tensors autograd saves (torch.autograd.graph.saved_tensors_hooks) and the
ledger's timeline of the trace on the tiny decoders (fp32 and bf16 autocast, LoRA, checkpointing), and
the code it stands for: transformers' models/llama/modeling_llama.py, models/gpt2/modeling_gpt2.py,
integrations/sdpa_attention.py and loss/loss_utils.py (ForCausalLMLoss).

The measured step pads its batch to max_seq_len: with padding transformers materialises the causal mask
(b x 1 x s x s bool) instead of SDPA's is_causal, so grouped-query attention repeats k and v to every
head (repeat_kv) before SDPA, and SDPA turns the mask into a float one of the query's dtype in every
layer. The embeddings, the head, the loss and the moments are in decoder_moments.py.
"""
from ..config.schema import is_on
from dataclasses import dataclass
from typing import Optional

from .activations import Precision, math_attention

LLAMA_FAMILY = ("llama", "mistral", "qwen2")
# GPT-2's activation: gelu_new is written in Python and keeps four T x intermediate tensors (its input,
# tanh's output, 0.5 * input and 1 + tanh); torch's own GELU kernels keep only their input.
GELU_SAVED = {"gelu_new": 4, "gelu": 1, "gelu_pytorch_tanh": 1, "relu": 1}


@dataclass
class DecoderShape:
    micro_batch: int
    seq_len: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    vocab: int
    architecture: str  # "llama" (the Llama family) or "gpt2"
    attention_dropout: float
    hidden_dropout: float  # GPT-2's residual dropout (resid_pdrop); none in the Llama family
    embedding_dropout: float
    activation_saved: int  # T x intermediate tensors the MLP's activation keeps
    causal_lm: bool  # logits for every token (causal_lm), or a score for the last one (classification)
    use_cache: bool  # the config's use_cache (transformers turns it off under gradient checkpointing)

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def qkv_weights(self) -> int:  # values of the q, k and v projections' weights
        return self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim


def weights_precision(pr: Precision, inv) -> Precision:
    """The precision's bytes for the weights the model really has: the residual stream follows the
    embeddings' dtype (a hub config's bf16 dtype makes them 16-bit)."""
    elem = next((t.elem for t in inv.params if t.embedding), pr.param)
    return Precision(param=elem, hidden=elem, matmul=min(pr.matmul, elem), autocast=pr.autocast)


def casts(pr: Precision) -> bool:
    """Autocast casts fp32 weights (and fp32 inputs of its 16-bit ops) to 16 bits; with 16-bit weights
    (and residual stream) those casts are no-ops."""
    return pr.autocast and pr.param > pr.matmul


def decoder_shape(config, job, micro_batch: int) -> Optional[DecoderShape]:
    """The decoder's shape, or None for a model this module has no terms for."""
    model_type = getattr(config, "model_type", "")
    b, s = micro_batch, job.max_seq_len
    causal = job.task.name.value == "causal_lm"
    cache = bool(getattr(config, "use_cache", True)) and not is_on(job.checkpointing)
    if model_type in LLAMA_FAMILY and getattr(config, "hidden_act", "silu") == "silu":
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return DecoderShape(b, s, config.hidden_size, heads, getattr(config, "num_key_value_heads", None) or heads,
                            head_dim, config.intermediate_size, config.num_hidden_layers, config.vocab_size, "llama",
                            getattr(config, "attention_dropout", 0.0) or 0.0, 0.0, 0.0, 0, causal, cache)
    if model_type == "gpt2" and config.activation_function in GELU_SAVED:
        return DecoderShape(b, s, config.n_embd, config.n_head, config.n_head, config.n_embd // config.n_head,
                            config.n_inner or 4 * config.n_embd, config.n_layer, config.vocab_size, "gpt2",
                            config.attn_pdrop, config.resid_pdrop, config.embd_pdrop,
                            GELU_SAVED[config.activation_function], causal, cache)
    return None


@dataclass
class Layer:
    """What one decoder layer trains and how its weights are stored."""
    trainable: bool  # its own weights train (full fine-tuning)
    grad_in: bool  # its input carries a gradient (something below it trains)
    lora_rank: int
    lora_modules: int  # adapted linear layers (peft's default: the attention's input projections)
    lora_dropout: float
    lora_bytes: int  # an adapter weight's bytes: peft keeps adapters in fp32 on a 16-bit base
    frozen_linear_weights: int  # values of its frozen (16-bit-castable) linear weights; 0 when trainable
    quantize: str  # "none", "nf4" or "int8": bitsandbytes' frozen base weights

    @property
    def mid(self) -> bool:  # the residual stream after attention carries a gradient
        return self.grad_in or self.trainable or self.lora_rank > 0


def mask_bytes(device: str, nbytes: int) -> int:
    """A dropout mask: a bool on CUDA, on the CPU a float of its input's dtype."""
    return 1 if device == "cuda" else nbytes


def attention_terms(sh: DecoderShape, pr: Precision, device: str, attention: str, ly: Layer) -> dict[str, int]:
    b, s, a, T, hq = sh.micro_batch, sh.seq_len, sh.heads, sh.tokens, sh.q_width
    c = pr.matmul
    out = T * hq * c if ly.trainable else 0  # heads merged by a copy, kept by a trainable output projection
    if attention == "eager":
        # q and the k, v given every head, kept by the two matmuls; softmax's output (the Llama family
        # asks for fp32, autocast runs GPT-2's in fp32) and its cast back to the query's dtype
        probs = b * a * s * s * (4 if sh.architecture == "llama" or pr.autocast else c)
        if sh.attention_dropout:  # dropout's mask and output (which the second matmul keeps)
            probs += b * a * s * s * (mask_bytes(device, c) + c)
        elif c < 4 and (sh.architecture == "llama" or pr.autocast):  # else the second matmul keeps the cast
            probs += b * a * s * s * c
        return {"attention q k v": 3 * T * hq * c, "attention s x s": probs, "attention output": out}
    if math_attention(sh, device, attention):
        # CPU SDPA with dropout runs its math path in fp32: q*scale, k^T, v, and three s x s tensors
        # (softmax output, dropout mask, dropped probabilities)
        return {"attention q k v": 3 * T * hq * 4, "attention s x s": 3 * b * a * s * s * 4, "attention output": out}
    # CUDA memory-efficient kernel / CPU flash: q, k, v (repeated to every head) and the output, which
    # the output projection reads as a view; the log-sum-exp; the float mask made from the bool one
    lse_len = -(-s // 32) * 32 if device == "cuda" else s
    # GPT-2's q is a view of the fused projection's output: keeping it keeps all three of q, k, v
    q = 3 * T * hq * c if sh.architecture == "gpt2" else T * hq * c
    return {"attention q k v out": q + 3 * T * hq * c, "attention logsumexp": b * a * lse_len * 4,
            "attention mask": b * s * s * c}


def lora_terms(sh: DecoderShape, pr: Precision, device: str, ly: Layer) -> int:
    """Per adapted linear layer: lora_dropout's mask (when its input carries a gradient) and output (the
    adapter's input: cast to 16 bits under autocast, else to the adapter's dtype), and the rank-r hidden
    lora_B keeps."""
    T, h = sh.tokens, sh.hidden
    nbytes = pr.matmul if pr.autocast else ly.lora_bytes
    # peft casts the adapter's input to the adapter's dtype before its dropout
    mask = mask_bytes(device, ly.lora_bytes) * T * h if ly.lora_dropout and ly.grad_in else 0
    if not ly.lora_dropout and nbytes == pr.hidden:  # nn.Identity: every adapter keeps the same input
        return T * h * pr.hidden + ly.lora_modules * T * ly.lora_rank * nbytes
    return ly.lora_modules * (mask + T * h * nbytes + T * ly.lora_rank * nbytes)


def base_linear_terms(sh: DecoderShape, pr: Precision, ly: Layer, inputs_fp32: int, inputs_cast: int) -> int:
    """What a layer's linear weights make it keep besides the activations themselves.
    Trainable: their inputs, for the weight gradients (autocast casts the input once per Linear; in fp32
    the Linears reading the same input share it). Frozen under autocast: the 16-bit cast of each weight
    whose input carries a gradient (autocast caches only weights that require grad). LLM.int8: the
    input itself, kept by bitsandbytes' MatMul8bitLt. 4-bit: nothing (MatMul4Bit keeps the packed weight)."""
    T, h = sh.tokens, sh.hidden
    if ly.trainable:
        return inputs_cast * T * h * pr.matmul if casts(pr) else inputs_fp32 * T * h * pr.hidden
    if ly.quantize == "int8":
        return ((1 if ly.grad_in else 0) + (1 if ly.mid else 0)) * T * h * pr.hidden
    if ly.quantize == "none" and casts(pr):
        qkv = 0 if ly.grad_in else sh.qkv_weights  # no gradient reaches q, k, v of the first layer
        return (ly.frozen_linear_weights - qkv) * pr.matmul
    return 0


def llama_layer(sh: DecoderShape, pr: Precision, device: str, attention: str, ly: Layer) -> dict[str, int]:
    T, h, i = sh.tokens, sh.hidden, sh.intermediate
    c = pr.matmul
    # a bitsandbytes layer returns its input's dtype (the residual stream's), whatever it computes in
    mlp = pr.hidden if ly.quantize != "none" else c

    def rmsnorm(grad: bool) -> int:
        # computed in fp32: pow and the multiply by rsqrt keep the fp32 input (an upcast copy in
        # bf16_true) and rsqrt's output; the weight's multiply keeps the normalised input
        return (T * h * 4 + T * 4 if grad else 0) + (T * h * pr.hidden if ly.trainable else 0)

    terms = {"input norm": rmsnorm(ly.grad_in),
             "linear inputs / weight casts": base_linear_terms(sh, pr, ly, inputs_fp32=2, inputs_cast=5)}
    if ly.lora_rank:
        terms["lora"] = lora_terms(sh, pr, device, ly)
    terms.update(attention_terms(sh, pr, device, attention, ly))
    terms["post-attention norm"] = rmsnorm(ly.mid)
    if ly.mid:  # SiLU keeps its input (gate's output); the product keeps both factors (SiLU's, up's output)
        terms["mlp gate, silu, up"] = 3 * T * i * mlp
    if ly.trainable:
        terms["mlp product (down input)"] = T * i * mlp
    return terms


def gpt2_layer(sh: DecoderShape, pr: Precision, device: str, attention: str, ly: Layer) -> dict[str, int]:
    T, h, i = sh.tokens, sh.hidden, sh.intermediate
    c = pr.matmul

    def layernorm(grad: bool) -> int:  # native_layer_norm keeps its input, mean and rstd
        return T * h * pr.hidden + 2 * T * 4 if grad or ly.trainable else 0

    dropout = mask_bytes(device, c) * T * h if sh.hidden_dropout and ly.mid else 0
    terms = {"ln_1": layernorm(ly.grad_in),
             "linear inputs / weight casts": base_linear_terms(sh, pr, ly, inputs_fp32=2, inputs_cast=2)}
    if ly.lora_rank:
        terms["lora"] = lora_terms(sh, pr, device, ly)
    terms.update(attention_terms(sh, pr, device, attention, ly))
    terms["residual dropout masks"] = 2 * dropout  # after the attention and after the MLP
    terms["ln_2"] = layernorm(ly.mid)
    if ly.mid:
        terms["mlp activation"] = sh.activation_saved * T * i * c
    if ly.trainable:
        terms["mlp c_proj input"] = T * i * c
    return terms


def layer_activations(sh: DecoderShape, pr: Precision, device: str, attention: str, ly: Layer) -> dict[str, int]:
    """Bytes one decoder layer holds for backward, by the tensors they are."""
    if not (ly.trainable or ly.grad_in or ly.lora_rank):
        return {}  # nothing in or below it trains: it runs without recording
    build = llama_layer if sh.architecture == "llama" else gpt2_layer
    return build(sh, pr, device, attention, ly)


def kv_cache(sh: DecoderShape, pr: Precision, attention: str, device: str) -> int:
    """The forward's KV cache: with use_cache on (its default), the model builds a DynamicCache even when
    training, each layer's k and v concatenated into it (copies) and returned with the output, so it is
    alive until the forward (with the loss) ends. Its dtype is k's: the Llama family's rotated k follows
    cos and sin (the embeddings' dtype; v is promoted to it), GPT-2's is the fused projection's output.
    Where attention keeps these very tensors (same dtype, no repeat, not the math path) they are no extra."""
    if not sh.use_cache:
        return 0
    nbytes = pr.hidden if sh.architecture == "llama" else pr.matmul
    own = sh.kv_heads == sh.heads  # not repeated: attention reads the cached tensors themselves
    if attention != "eager" and math_attention(sh, device, attention):
        kept = 1 if own and nbytes == 4 else 0  # the fp32 math path keeps a view of v (scaled copies of q, k)
    else:
        kept = 2 if own and nbytes == pr.matmul else 0  # kept as they are unless autocast casts them
    return sh.layers * (2 - kept) * sh.tokens * sh.kv_heads * sh.head_dim * nbytes


def checkpoint_shared(sh: DecoderShape, pr: Precision, ly: Layer) -> int:
    """What a recomputed layer keeps that is the checkpoint's own input: its first norm's input (the Llama
    family's RMSNorm keeps a fp32 copy instead when the residual stream is 16-bit)."""
    if sh.architecture == "llama":
        return sh.tokens * sh.hidden * 4 if ly.grad_in and pr.hidden == 4 else 0
    return sh.tokens * sh.hidden * pr.hidden if ly.grad_in or ly.trainable else 0


def backward_transient(sh: DecoderShape, pr: Precision, ly: Layer, dequantized: int) -> int:
    """Beyond the saved tensors, the most a layer's backward holds at once: the gradient arriving at its
    output; in the MLP the gradient of the activation's output (SwiGLU: the product) and those of its
    factors (SiLU's and up's output), less the product itself when a trainable down projection kept it
    (freed once its weight's gradient is made, which is then alive); a quantized weight dequantized for the
    input's gradient."""
    T, h, i = sh.tokens, sh.hidden, sh.intermediate
    mlp = pr.hidden if ly.quantize != "none" else pr.matmul
    weight = h * i * pr.param if ly.trainable else 0
    return T * h * pr.hidden + (2 if ly.trainable else 3) * T * i * mlp + weight + dequantized
