"""Named adjustments for published rows measured with other libraries than the ones memsweep installs: older
releases, FSDP1 where memsweep has FSDP2, a training script's own loss and loop.

memsweep's estimate is the step of the libraries it installs. A published figure measured years earlier, or
through another library's code, can differ by what that code did; where the source states its version or its
set-up and the difference is a documented behaviour of that code, the row is estimated as that code stepped,
and the adjustment is named in the row's note. Nothing here is fitted to a table: each adjustment is a
mechanism with its source and what it applies to, and a table that states neither gets none.

- torch's foreach Adam / AdamW before July 2023 made the update's denominator out of place:
  `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`, divided in place by the bias correction, then
  `denom = torch._foreach_add(exp_avg_sq_sqrt, eps)` and `torch._foreach_addcdiv_(params, exp_avgs, denom, ...)`:
  two lists the size of the parameters alive at the update, where the torch memsweep installs keeps one
  (it adds eps in place). pytorch/pytorch issue #97712 ("Foreach optimizers use higher memory due to
  intermediates"); the Adam family was reduced to one intermediate by the PRs of 2023-07-10 (#104898 for
  AdamW, the issue's comment of 2023-07-12 for Adam), so torch 2.0.x and the 2.1 nightlies dated before
  2023-07-10 hold the second list; torch 2.1.0 (October 2023) does not.
- Lightning's `FSDPStrategy` is FSDP1 where memsweep shards with FSDP2: what FSDP1's step holds that FSDP2's
  does not is fsdp1.py's. Its flat parameters wherever a table or row names FSDPStrategy; its run-ahead
  without the rate limiter (unsharded buffers freed on other streams reused after the micro-batch; with CPU
  offload, each shard's device copy too) where the stated torch predates the limiter's default.
- bitsandbytes before 0.43.2 kept a 4-bit linear's input for backward (`MatMul4Bit.forward`:
  `ctx.tensors = (A, B)` whenever a gradient is needed), though the backward reads only the weight: for
  every 4-bit layer whose input requires a gradient, that input stays alive until the layer's backward.
  bitsandbytes PR #1270 (released in 0.43.2) saves `(None, B)`, as the installed one does. While a table
  stating such a bitsandbytes is estimated, the installed MatMul4Bit keeps its input so.
- A script that calls optimizer.zero_grad() between the forward and the backward (as Raschka's scripts do:
  `logits = model(features)`, `optimizer.zero_grad()`, `backward`, `optimizer.step()`) keeps the previous
  step's gradients through the forward; Trainer, which memsweep runs, zeroes them after the step. A table
  or row states `zero_grad: after the forward` where its code does; it is estimated with the gradients
  freed (set to None, torch >= 2.0's default) as the step's first backward begins.
- torchtune's LoRA recipe before 2024-07-28 (pytorch/torchtune PR #1235, "delete logits before bwd": "free
  logits otherwise it peaks backward memory") ran `logits = self._model(input_ids)` (the model returns
  `self.output(h).float()`), `logits = logits[..., :-1, :].contiguous()`, the loss, then `loss.backward()`
  with `logits` still bound: the fp32 shifted logits alive through the backward and until the next forward
  returns. A table stating a torchtune commit dated before that is estimated with the causal-LM loss
  computed so and its shifted logits kept until the next micro-batch's loss.
- torchtitan's FSDP2 mixed precision reduces gradients in fp32 (`MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)`, its `mixed_precision_reduce` default), where Accelerate's bf16 policy reduces in bf16:
  each unit's reduce-scatter input is the unit's gradients cast to fp32 (FSDP2's foreach_reduce). A table
  whose precision states `reduce_dtype fp32` is estimated with that policy.
- transformers 4.x's DistilBERT attention (`MultiHeadSelfAttention.forward`, e.g. at 4.28.1 and 4.31.0.dev0)
  divided the query by sqrt(head dim), masked the scores in their own dtype (`scores.masked_fill(mask,
  finfo(scores.dtype).min)`) and took their softmax; the installed one scales the scores and adds an fp32 mask,
  which makes them fp32. On a GPU under autocast the 4.x scores stay 16-bit up to the softmax, which CUDA's
  autocast runs in fp32: from an fp16 input directly, from a bf16 one through an fp32 copy (ATen's SoftMax.cpp).
  A table stating a transformers 4.x release with DistilBERT is estimated with that attention.
- lit-gpt's code where memsweep runs transformers' and peft's (its loss, on the float32 logits Fabric hands back
  in 16-bit true precision, its attention and LoRA padding, its RMSNorm) is litgpt.py's, applied where a table
  states lit-gpt's commit or its loss.
"""
import contextlib
import re
from collections.abc import Iterator
from typing import Any

import yaml

import fsdp1
import litgpt
from patching import patched

# "torch 2.0.0", "torch 2.1.0.dev20230623+cu118", "PyTorch 2.1.0+cu121": the first version the table states
TORCH = re.compile(r"\b(?:py)?torch[ =]+(\d+)\.(\d+)\.(\d+)(?:\.dev(\d{8}))?", re.IGNORECASE)
# (major, minor, nightly date) of the change: the foreach Adam family's PRs merged from 2023-07-10 on, so a 2.1
# nightly dated before keeps two lists; the 2.1.0 release (October 2023) and later keep one
FOREACH_ADAM_ONE_INTERMEDIATE = (2, 1, "20230710")
BITSANDBYTES = re.compile(r"\bbitsandbytes[ =]+(\d+)\.(\d+)\.(\d+)", re.IGNORECASE)
TRANSFORMERS_4 = re.compile(r"\btransformers[ =]+4\.\d+", re.IGNORECASE)
LITGPT = re.compile(r"\blit-gpt commit [0-9a-f]{7,40}", re.IGNORECASE)  # whose code litgpt.py reads
# "torchtune at commit ff594c2... (2024-04-15)": the commit's date, which the held logits are judged by
TORCHTUNE = re.compile(r"\btorchtune at commit [0-9a-f]{7,40} \((\d{4}-\d{2}-\d{2})\)", re.IGNORECASE)
TORCHTUNE_FREES_LOGITS = "2024-07-28"  # PR #1235: `del logits` before the backward
BNB_DROPS_INPUT = (0, 43, 2)  # the first release with PR #1270
FOREACH_ADAM = "foreach Adam's second intermediate (torch < 2.1, pytorch#97712)"
BNB_KEEPS_INPUT = "bitsandbytes < 0.43.2 kept each 4-bit linear's input for backward (bitsandbytes PR #1270)"
FSDP1_FLAT = "FSDP1's flat parameters: a unit with a trainable parameter gets a gradient for all (litgpt#1417)"
FSDP1_RATE_LIMITER = (2, 1, "20230711")  # limit_all_gathers=True by default from this nightly (PR #104900)
FSDP1_UNLIMITED = ("FSDP1 without its rate limiter (torch < 2.1, pytorch#104900): unsharded parameters and "
                   "gradients freed on other streams reused after the micro-batch")
ZERO_GRAD_AFTER_FORWARD = "the script's zero_grad after the forward: the last step's gradients alive through it"
TORCHTUNE_LOGITS = ("torchtune's recipe before PR #1235: its fp32 shifted logits held through the backward "
                    "(`logits` still bound)")
FP32_REDUCE = "FSDP2 reducing gradients in fp32 (torchtitan's MixedPrecisionPolicy)"
DISTILBERT_MASKED_FILL = "transformers 4.x DistilBERT attention: the scores masked in their own dtype (masked_fill)"


def fields(table: dict[str, Any], row: dict[str, Any] | None = None) -> dict[str, Any]:
    """The table's set-up (its `common`) with the row's own fields over it."""
    return {**table.get("common", {}), **(row or {})}


def setup(table: dict[str, Any], row: dict[str, Any] | None = None) -> str:
    """The table's set-up and the row's fields as one text, where versions and libraries are looked for."""
    return yaml.safe_dump(fields(table, row), width=10_000)


def stated_torch(table: dict[str, Any]) -> tuple[int, int, str] | None:
    """(major, minor, nightly date or "" for a release) of the torch the table's set-up states, else None."""
    found = TORCH.search(setup(table))
    if found is None:
        return None
    major, minor, _, nightly = found.groups()
    return int(major), int(minor), nightly or ""


def before(version: tuple[int, int, str] | None, change: tuple[int, int, str]) -> bool:
    """Whether a stated torch (major, minor, nightly date or "") predates a change first in `change`'s nightly
    (whose release, made after it, has it)."""
    if version is None:
        return False
    major, minor, nightly = version
    if (major, minor) != change[:2]:
        return (major, minor) < change[:2]
    return bool(nightly) and nightly < change[2]


def holds_logits(stated: str) -> bool:
    """Whether the table's torchtune recipe kept its logits through the backward (see the module)."""
    found = TORCHTUNE.search(stated)
    return found is not None and found.group(1) < TORCHTUNE_FREES_LOGITS


def foreach_adam_holds_denom(version: tuple[int, int, str] | None) -> bool:
    """Whether that torch's foreach Adam / AdamW kept the second parameter-sized list (see the module)."""
    return before(version, FOREACH_ADAM_ONE_INTERMEDIATE)


def adjustments(table: dict[str, Any], row: dict[str, Any] | None = None) -> list[str]:
    """The names of the adjustments a table's rows (or one row, whose own fields may say more) are estimated
    with (empty: the installed libraries). Lightning's FSDPStrategy is FSDP1 in every Lightning release."""
    stated, torch_version = setup(table, row), stated_torch(table)
    bnb = BITSANDBYTES.search(stated)
    fsdp1 = "FSDPStrategy" in stated
    given = fields(table, row)
    litgpt_code = LITGPT.search(stated) is not None
    distilbert_4 = TRANSFORMERS_4.search(stated) is not None and "distilbert" in str(given.get("model"))
    return ([FOREACH_ADAM] if foreach_adam_holds_denom(torch_version) else []) + (
        [BNB_KEEPS_INPUT] if bnb and tuple(map(int, bnb.groups())) < BNB_DROPS_INPUT else []) + (
        [FSDP1_FLAT] if fsdp1 else []) + (
        [FSDP1_UNLIMITED] if fsdp1 and before(torch_version, FSDP1_RATE_LIMITER) else []) + (
        [ZERO_GRAD_AFTER_FORWARD] if given.get("zero_grad") == "after the forward" else []) + (
        [TORCHTUNE_LOGITS] if holds_logits(stated) else []) + (
        [FP32_REDUCE] if "reduce_dtype fp32" in stated else []) + (
        [DISTILBERT_MASKED_FILL] if distilbert_4 else []) + (
        [litgpt.LOSS] if "chunked_cross_entropy" in stated else []) + (
        [litgpt.FABRIC_OUTPUTS] if litgpt_code and "16-true" in stated else []) + (
        [litgpt.ATTENTION] if litgpt_code else []) + (
        [litgpt.RMSNORM] if litgpt_code and "llama" in str(given.get("model")).lower() else [])


@contextlib.contextmanager
def stepping_as(names: list[str]) -> Iterator[None]:
    """While a row is estimated: the named code steps as the table's libraries did (see the module)."""
    with contextlib.ExitStack() as stack:
        if FOREACH_ADAM in names:
            stack.enter_context(foreach_adam_with_denom())
        if FSDP1_FLAT in names:
            stack.enter_context(fsdp1.flat_unit_gradients())
        if FSDP1_UNLIMITED in names:
            stack.enter_context(fsdp1.host_ahead())
        if TORCHTUNE_LOGITS in names:
            stack.enter_context(logits_held_through_backward())
        if ZERO_GRAD_AFTER_FORWARD in names:
            stack.enter_context(zero_grad_before_backward())
        if litgpt.LOSS in names:
            stack.enter_context(litgpt.loss(fabric_outputs=litgpt.FABRIC_OUTPUTS in names))
        if litgpt.ATTENTION in names:
            stack.enter_context(litgpt.attention())
        if litgpt.RMSNORM in names:
            stack.enter_context(litgpt.rmsnorm())
        if FP32_REDUCE in names:
            stack.enter_context(fp32_reduce())
        if BNB_KEEPS_INPUT in names:
            stack.enter_context(matmul_4bit_keeps_input())
        if DISTILBERT_MASKED_FILL in names:
            stack.enter_context(distilbert_masked_fill())
        yield


@contextlib.contextmanager
def distilbert_masked_fill() -> Iterator[None]:
    """DistilBERT's eager attention as transformers 4.x wrote it (see the module), on the installed model's mask:
    0 where a key is attended, the dtype's minimum where it is masked."""
    import math

    import torch
    from transformers.models.distilbert import modeling_distilbert

    def masked_fill(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        query = query / math.sqrt(query.size(-1))
        scores = torch.matmul(query, key.transpose(2, 3))
        if attention_mask is not None:
            masked = (attention_mask[:, :, :1, :] < 0).expand_as(scores)
            scores = scores.masked_fill(masked, torch.tensor(torch.finfo(scores.dtype).min))
        weights = torch.nn.functional.softmax(scores, dim=-1)
        weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    with patched([(modeling_distilbert, "eager_attention_forward", masked_fill)]):
        yield


@contextlib.contextmanager
def matmul_4bit_keeps_input() -> Iterator[None]:
    """bitsandbytes' MatMul4Bit holding its input from its forward to its backward, as before 0.43.2 (see the
    module). There the reference outlived the backward for as long as anything held the graph (a loop's
    `loss` until the next micro-batch's); the published peaks are a first micro-batch's (the longest sample
    first), with no earlier graph alive, so here it ends with the layer's backward."""
    from bitsandbytes.autograd._functions import MatMul4Bit

    forward, backward = MatMul4Bit.forward, MatMul4Bit.backward

    def keeping(ctx, A, B, *args, **kwargs):
        out = forward(ctx, A, B, *args, **kwargs)
        if any(ctx.needs_input_grad[:2]):
            ctx.tensors = (A, ctx.tensors[1])
        return out

    def releasing(ctx, grad_output):
        grads = backward(ctx, grad_output)
        ctx.tensors = (None, None)
        return grads

    MatMul4Bit.forward, MatMul4Bit.backward = staticmethod(keeping), staticmethod(releasing)
    try:
        yield
    finally:
        MatMul4Bit.forward, MatMul4Bit.backward = staticmethod(forward), staticmethod(backward)


@contextlib.contextmanager
def foreach_adam_with_denom() -> Iterator[None]:
    """torch's foreach Adam / AdamW as it stepped before July 2023 (see the module)."""
    import torch
    import torch.optim.adam as adam

    installed = adam._multi_tensor_adam

    def with_denom(params, grads, exp_avgs, exp_avg_sqs, *args, **kwargs):
        # the older step's sqrt(v) list beside the one the installed step makes: both alive at the update
        older = torch._foreach_sqrt(exp_avg_sqs) if exp_avg_sqs else None
        installed(params, grads, exp_avgs, exp_avg_sqs, *args, **kwargs)
        del older

    with patched([(adam, "_multi_tensor_adam", with_denom)]):  # AdamW steps through torch.optim.adam as well
        yield


@contextlib.contextmanager
def zero_grad_before_backward() -> Iterator[None]:
    """The trace's training step zeroing the gradients (set to None) as its first backward begins instead of after
    the optimizer step (see the module): the step before leaves its gradients for the next forward."""
    import memsweep.estimate.trace as trace
    from memsweep.estimate.step import NoMarks

    installed = trace.training_step

    class Marks:
        def __init__(self, marks, model):
            self.marks, self.model, self.zeroed = marks, model, False

        def mark(self, name: str) -> None:
            if name == "backward" and not self.zeroed:  # the step's first backward: later ones accumulate
                type(self.model).zero_grad(self.model, set_to_none=True)
                self.zeroed = True
            self.marks.mark(name)

        def __getattr__(self, name):
            return getattr(self.marks, name)

    def stepping(model, optimizer, batches, setup, marks=None, **kwargs):
        marks = Marks(marks or NoMarks(), model)
        model.zero_grad = lambda *args, **kw: None  # the step's end keeps them
        try:
            installed(model, optimizer, batches, setup, marks=marks, **kwargs)
        finally:
            del model.zero_grad

    with patched([(trace, "training_step", stepping)]):
        yield


@contextlib.contextmanager
def fp32_reduce() -> Iterator[None]:
    """Accelerate's FSDP2 mixed-precision policy with its gradients reduced in fp32, as torchtitan's (see the
    module)."""
    import dataclasses

    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin

    installed = FullyShardedDataParallelPlugin.set_mixed_precision

    def reducing_in_fp32(self, *args, **kwargs):
        installed(self, *args, **kwargs)
        self.mixed_precision_policy = dataclasses.replace(self.mixed_precision_policy, reduce_dtype=torch.float32)

    with patched([(FullyShardedDataParallelPlugin, "set_mixed_precision", reducing_in_fp32)]):
        yield


@contextlib.contextmanager
def logits_held_through_backward() -> Iterator[None]:
    """transformers' causal-LM loss as torchtune's recipe computed it before PR #1235 (see the module): fp32
    logits, shifted into a contiguous copy that stays alive until the next micro-batch's loss replaces it."""
    import torch
    from transformers.loss.loss_utils import LOSS_MAPPING

    held: list = []

    def shifted_and_held(logits, labels, vocab_size, ignore_index=-100, **kwargs):
        logits = logits.float()  # the model's `self.output(h).float()`
        held.clear()  # the last micro-batch's, released as `logits` is bound again
        held.append(logits[..., :-1, :].contiguous())
        return torch.nn.functional.cross_entropy(held[0].transpose(1, 2), labels[..., 1:].contiguous(),
                                                 ignore_index=ignore_index)

    with patched([(LOSS_MAPPING, "ForCausalLM", shifted_and_held)]):
        yield
