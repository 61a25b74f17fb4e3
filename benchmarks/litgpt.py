"""lit-gpt's code where memsweep runs transformers' and peft's: what lit-gpt's fine-tuning step kept that the
same model in transformers does not, for the published Lit-GPT tables (lit-gpt commit 8641822b, read there:
finetune/lora.py, lit_gpt/model.py, lit_gpt/lora.py, lit_gpt/rmsnorm.py, lit_gpt/utils.py).

- Its loss, `chunked_cross_entropy` with `lm_head_chunk_size=128`: cross-entropy of the bf16 logits in 128-token
  chunks, without transformers' upcast to fp32. (Its loop's `logits` also keeps a micro-batch's graph until the
  next forward returns; the peak these tables print is their first micro-batch's, which lit-gpt fills with the
  longest sample, with no earlier graph alive, so that is not modelled.)
- Lightning Fabric's true-precision plugins (`HalfPrecision` for `--precision bf16-true`, `BitsandbytesPrecision`
  for `--quantize bnb.*`, `FSDPPrecision`: lightning/fabric/plugins/precision, `convert_output`) hand the module's
  floating outputs back in the default dtype, float32: lit-gpt's loop binds those float32 logits (`logits =
  model(input_ids, lm_head_chunk_size=128)`, finetune/lora.py), keeps them until the next forward returns, and its
  loss reads them, so its log-softmax keeps a float32 result too. Two float32 copies of the logits where the bf16
  model keeps two bf16 ones: four bytes a token and vocabulary entry more.
- Its attention reads views of one fused qkv output (`CausalSelfAttention.forward`: `qkv.view(...).permute(...)`,
  split, reshape; only q and k are roped into new tensors) and has no KV cache in training (the cache is set up for
  generation only), so SDPA's saved value keeps the whole fused output alive until the layer's backward.
  transformers' forward with the config's `use_cache` copies k and v into a DynamicCache (`torch.cat`), and SDPA
  keeps those copies instead. Estimated with `use_cache` off, which makes GPT-NeoX's value a view of its fused
  output as lit-gpt's is. Phi and Llama have separate q, k and v projections in transformers; there the fused
  output lit-gpt keeps whole (two hidden widths a token more than a v) and its one LoRA A and dropout for q and v
  (peft: one each) are not modelled, about half a hidden width a token and layer in all.
- Its LoRA on q and v of the fused qkv (`LoRAQKVLinear.zero_pad`) puts the update into the fused width with
  `index_copy`, whose source gradient `grad.index_select(dim, index).expand_as(source)` reads the source, so
  autograd keeps the (tokens x q+v) update for backward (torch's derivatives.yaml). Estimated with each LoRA
  update of q and v so padded: the q and v thirds of a fused qkv, all of a q or v projection.
- Its RMSNorm (`lit_gpt/rmsnorm.py`) computes in the activations' dtype and keeps the bf16 input, where
  transformers' LlamaRMSNorm upcasts to fp32 and keeps the fp32 input.

Checked by running lit-gpt's own model, loss and loop at that commit on the same fake tensors (not shipped: lit-gpt
is not installed): phi-1.5, StableLM-Alpha-3B and Llama-2-7B at micro-batch 1 and 2 peak within 1 % of these
estimates (with the tables' bf16 LoRA weights, `lora.autocast_adapter_dtype=false`).
"""
import contextlib
from collections.abc import Iterator

from patching import patched

LOSS = "lit-gpt's chunked cross-entropy on bf16 logits (lit_gpt/utils.py chunked_cross_entropy)"
FABRIC_OUTPUTS = ("Lightning Fabric's true precision: the logits handed back in float32 (convert_output), held by "
                  "lit-gpt's loop until the next forward returns")
ATTENTION = ("lit-gpt's attention: no KV cache in training, its value a view of the fused qkv output "
             "(lit_gpt/model.py); LoRA's q and v update padded by index_copy, which keeps it "
             "(lit_gpt/lora.py zero_pad)")
RMSNORM = "lit-gpt's RMSNorm in bf16, keeping the bf16 input (lit_gpt/rmsnorm.py)"
FUSED_QKV = "query_key_value"  # transformers' name for a fused qkv projection (GPT-NeoX), as lit-gpt's `attn`


@contextlib.contextmanager
def loss(chunk: int = 128, fabric_outputs: bool = False) -> Iterator[None]:
    """transformers' causal-LM loss as lit-gpt's chunked_cross_entropy computes it; with `fabric_outputs`, on the
    float32 logits Fabric hands back, which lit-gpt's loop holds (see the module)."""
    import torch
    from transformers.loss.loss_utils import LOSS_MAPPING

    held: list = []  # lit-gpt's `logits`, bound again when the next forward returns

    def chunked(logits, labels, vocab_size, ignore_index=-100, **kwargs):
        if fabric_outputs:
            logits = logits.float()
            held[:] = [logits]
        pairs = zip(logits[..., :-1, :].split(chunk, dim=1), labels[..., 1:].split(chunk, dim=1))
        losses = [torch.nn.functional.cross_entropy(x.reshape(-1, vocab_size), y.reshape(-1),
                                                    ignore_index=ignore_index, reduction="none") for x, y in pairs]
        return torch.cat(losses).mean()

    with patched([(LOSS_MAPPING, "ForCausalLM", chunked)]):
        yield


def padded_update(fused: bool):
    """A forward hook for a LoRA B: its update put into the layer's width by index_copy, as lit-gpt's zero_pad."""
    import torch

    def pad(module, inputs, update):
        width = update.shape[-1]
        columns = torch.arange(width, device=update.device)
        if fused:  # the q and v thirds: lit-gpt's B makes only those (which columns does not change what is kept)
            columns = torch.cat((columns[: width // 3], columns[2 * width // 3:]))
        return update.new_zeros(update.shape).index_copy(-1, columns, update.index_select(-1, columns))

    return pad


@contextlib.contextmanager
def attention() -> Iterator[None]:
    """The trace's training step with lit-gpt's attention (see the module): no KV cache, LoRA updates padded."""
    from transformers import PreTrainedModel

    import memsweep.estimate.trace as trace

    installed = trace.training_step

    def stepping(model, *args, **kwargs):
        hooks, configs = [], {}
        for name, module in model.named_modules():
            if isinstance(module, PreTrainedModel):
                configs.setdefault(id(module.config), (module.config, module.config.use_cache))
                module.config.use_cache = False
            if name.endswith("lora_B"):  # peft's ModuleDict of each adapted layer's B
                hooks += [b.register_forward_hook(padded_update(FUSED_QKV in name)) for b in module.values()]
        try:
            installed(model, *args, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
            for config, use_cache in configs.values():
                config.use_cache = use_cache

    with patched([(trace, "training_step", stepping)]):
        yield


@contextlib.contextmanager
def rmsnorm() -> Iterator[None]:
    """transformers' LlamaRMSNorm computing as lit-gpt's RMSNorm does (see the module)."""
    import torch
    from transformers.models.llama import modeling_llama

    def forward(self, x):
        norm_x = torch.mean(x * x, dim=-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(norm_x + self.variance_epsilon))

    with patched([(modeling_llama.LlamaRMSNorm, "forward", forward)]):
        yield

