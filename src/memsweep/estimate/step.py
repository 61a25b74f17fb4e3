"""One training step as MemsweepTrainer runs it, on the trace's fake model: the optimizer Trainer would
build (its class, kwargs and parameter groups), a collated batch padded to max_seq_len, and the step
from the first micro-batch to zero_grad, with marks for the recorder (capture.py) where it is.
"""
import contextlib
import inspect
import tempfile
from typing import Any, NamedTuple

import torch

from ..config.schema import HardwareConf
from ..measure.ledger import eager
from ..measure.optimizer_state import inner_optimizer, plain_tensors
from ..techniques import optim
from . import sharded


class NoMarks:
    """Where no recorder listens (the ledger's trace on a CPU, the FLOP count)."""

    def mark(self, name: str) -> None:
        pass

    def tag_grads(self, model) -> None:
        pass

    def viewed(self, t) -> bool:
        return False


NO_MARKS = NoMarks()
# The micro-batches a step's trace runs: those after the second repeat the second exactly (all gradients alive,
# the same activations), so two stand for any number (view_later_inputs adds what each later one keeps).
RUN_MICRO_BATCHES = 2


def trainer_arguments(setup, keys: tuple[str, ...]):
    """TrainingArguments of the setup's `keys`, on the CPU: what Trainer derives from them."""
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=tempfile.gettempdir(), use_cpu=True, report_to="none",
                             **{k: setup.args[k] for k in keys if k in setup.args})



class OptimizerSpec(NamedTuple):
    """The optimizer as Trainer would choose it: its class, its kwargs, and the TrainingArguments they come from."""
    cls: type
    kwargs: dict[str, Any]
    args: Any  # transformers.TrainingArguments


def optimizer_spec(setup, model) -> OptimizerSpec:
    """The optimizer's class and kwargs as Trainer would choose them for the setup's arguments."""
    from transformers import Trainer

    args = trainer_arguments(setup, ("optim", "optim_args", "learning_rate", "weight_decay"))
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    return OptimizerSpec(cls, kwargs, args)


def build_optimizer(setup, model, profile: HardwareConf, spec: OptimizerSpec):
    """The optimizer Trainer.create_optimizer would build: its class, kwargs and parameter groups
    (`spec`: optimizer_spec's answer, asked before the model is sharded)."""
    from transformers import Trainer

    cls, kwargs, args = spec
    groups = optim.param_groups(model, set(Trainer.get_decay_parameter_names(None, model)),  # `self` unused
                                args.weight_decay)
    kwargs = on_device(cls, kwargs, profile)
    if not cls.__module__.startswith("bitsandbytes"):
        torchao_maps(cls)
        return cls(groups, **kwargs)
    return bitsandbytes_optimizer(cls, groups, kwargs, model)


def on_device(cls, kwargs: dict, profile: HardwareConf) -> dict:
    """The optimizer's kwargs as the profile's device runs it: on a GPU torch's optimizers default to their
    foreach kernels, whose temporaries span a whole parameter group (on the CPU: one tensor at a time)."""
    if profile.device == "cuda" and "foreach" in inspect.signature(cls).parameters and "fused" not in kwargs:
        return {**kwargs, "foreach": True}
    return kwargs


def flat_partition_step(spec, numel: int, profile: HardwareConf):
    """The client optimizer stepping one flat fp32 partition of `numel` values, as DeepSpeed's ZeRO steps
    it (stage_1_and_2.py: single_partition_of_fp32_groups): (its state, made by a first step; the events
    of the next step, recorded). On fake tensors: no memory."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .capture import Recorder

    with FakeTensorMode(), eager():
        flat, optimizer = flat_optimizer(spec, numel, profile)
        state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        with Recorder([("optimizer", flat), ("grads", flat.grad), *(("optimizer", v) for v in state)]) as recorder:
            recorder.mark("step")
            optimizer.step()
            recorder.mark("end")
    return sum(v.untyped_storage().nbytes() for v in state), recorder


def flat_optimizer(spec: OptimizerSpec, numel: int, profile: HardwareConf):
    """(one flat fp32 partition of `numel` values with a gradient, the client optimizer over it, its state made
    by a first step); inside the caller's fake mode."""
    cls, kwargs, _ = spec
    torchao_maps(cls)
    flat = torch.nn.Parameter(torch.empty(numel, dtype=torch.float32))
    flat.grad = torch.empty_like(flat)
    optimizer = cls([flat], **on_device(cls, kwargs, profile))
    optimizer.step()
    return flat, optimizer


def flat_partition_ops(spec, numel: int, profile: HardwareConf, dtype: torch.dtype) -> tuple[list, list]:
    """The ops of ZeRO's optimizer step on one process's partition of `numel` values whose gradients and model
    weights are `dtype`, as stage_1_and_2.py's step runs them (stage3.py's likewise): the gradients' norm
    (get_grad_norm_direct, for clipping), the partition's gradients cast to fp32 (single_grad_partition),
    scaled in place by the clip (unscale_and_clip_grads; Trainer passes its max_grad_norm), the client
    optimizer's step on the fp32 partition, and the updated values copied into the model's weights
    (bit16_partitions). Not in it: flattening gradients that are not contiguous, a norm per gradient tensor
    (one here) and the engine's Python. (op_record.reading of them, their sequence), phase "step"."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from . import op_record

    with FakeTensorMode(), eager():
        flat, optimizer = flat_optimizer(spec, numel, profile)
        grads, weights = torch.empty(numel, dtype=dtype), torch.empty(numel, dtype=dtype)
        with op_record.recording(on_cpu=profile.device == "cpu") as ops:
            ops.mark("step")
            torch.linalg.vector_norm(grads)
            flat.grad = grads.to(torch.float32)
            flat.grad.mul_(0.5)
            optimizer.step()
            weights.copy_(flat)
    return op_record.reading(ops), ops.sequence


def torchao_maps(cls) -> None:
    """torchao's low-bit optimizers make their state at the first step from quantization maps computed
    once per process (values read with .tolist(), then cached): computed here, outside fake mode, a fake
    step finds them."""
    if not cls.__module__.startswith("torchao"):
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torchao.optim import subclass_4bit, subclass_8bit

    with unset_fake_temporarily():
        for module in (subclass_8bit, subclass_4bit):
            module.get_qmap_signed(), module.get_qmap_unsigned()


def bitsandbytes_optimizer(cls, groups, kwargs, model):
    """A bitsandbytes optimizer on fake parameters, as Trainer.create_optimizer builds it. Its step runs
    on fake tensors (every bitsandbytes op has a fake kernel); only its constructor computes values, the
    two 256-entry quantization maps, so it runs outside fake mode and the maps become fake tensors."""
    from bitsandbytes.optim import GlobalOptimManager
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    fake_mode = next(model.parameters()).fake_mode
    with unset_fake_temporarily():
        optimizer = cls(groups, **kwargs)
    optimizer.name2qmap = {k: fake_mode.from_tensor(v) for k, v in optimizer.name2qmap.items()}
    if kwargs.get("optim_bits") == 8:  # Trainer keeps every embedding's state in 32 bits
        manager = GlobalOptimManager.get_instance()
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                manager.register_module_override(module, "weight", {"optim_bits": 32})
    return optimizer



def fake_batch(model, micro_batch: int, seq_len: int, task: str) -> dict[str, torch.Tensor]:
    """A collated batch of seq_len tokens, as the ledger step gets (values do not matter on fake tensors):
    a label per sequence (classification) or per token (causal_lm); for an image task, images of the model's
    size and a label per image (seq_len does not apply: the model's patch grid is its sequence)."""
    if task == "image_classification":
        return image_batch(model.config, micro_batch)
    ids = torch.zeros(micro_batch, seq_len, dtype=torch.long)
    labels = torch.zeros_like(ids) if task == "causal_lm" else torch.zeros(micro_batch, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    # BERT tokenizers return token types, DistilBERT's none
    if task != "causal_lm" and getattr(model.config, "type_vocab_size", 0):
        batch["token_type_ids"] = torch.zeros_like(ids)
    return batch


def image_batch(config, micro_batch: int) -> dict[str, torch.Tensor]:
    """A batch of fp32 images at the model's input size (run/images.py makes them so) and their labels."""
    size = config.image_size if isinstance(config.image_size, (list, tuple)) else (config.image_size,) * 2
    pixels = torch.zeros(micro_batch, getattr(config, "num_channels", 3), *size)
    return {"pixel_values": pixels, "labels": torch.zeros(micro_batch, dtype=torch.long)}


class TrainerLoop:
    """What Trainer's loop (transformers/trainer.py, Trainer._run_epoch) keeps on the device between micro-batches
    and steps, which the ledger counts from the op of the step that first outputs it: the running loss
    (`self._tr_loss`, made at train start, `+= tr_loss_step` in place after each micro-batch), the loss
    training_step returned (`tr_loss_step`: `loss.detach()`, the storage of its loss divided by the accumulation,
    held until the next micro-batch's training_step returns, so through that one's backward), MemsweepTrainer's
    count of tokens (run/trainer.py, `_track_num_input_tokens`: `mask.sum()` added into `_tokens_pending`, one
    process only) and the gradients' norm (`grad_norm`, returned by clip_grad_norm_ and kept to log, through the
    optimizer step). One serves the trace's warm-up and measured steps, as one Trainer runs the real job's
    first step and its ledger's (the second)."""

    def __init__(self):
        self.running = torch.zeros(())  # Trainer's torch.tensor(0.0): fp32 whatever the loss
        self.reported = self.tokens = self.grad_norm = None

    def after_micro_batch(self, loss, batch, setup) -> None:
        self.reported = loss.detach()  # the previous micro-batch's loss dies here
        self.running += self.reported
        if setup.world_size == 1 and "attention_mask" in batch:  # else Trainer's own count, gathered and read
            count = batch["attention_mask"].sum()
            self.tokens = count if self.tokens is None else self.tokens + count


def scales_loss(setup) -> bool:
    """Whether a GradScaler scales the loss (fp16 mixed precision)."""
    return bool(setup.grad_scaler or setup.args.get("fp16"))


def backward(loss, setup) -> None:
    """Accelerator.backward as Trainer.training_step calls it (accelerate/accelerator.py): outside DeepSpeed it
    divides the loss by its own accumulation steps, which Trainer sets to 1 (it divides the loss itself): a new
    0-dim tensor, alive as backward's local for the whole backward. Under a GradScaler backward runs on
    `scaler.scale(loss)`, a third."""
    if not setup.techniques.deepspeed.on:
        loss = loss / 1
    if scales_loss(setup):
        (loss * 65536.0).backward()  # GradScaler.scale: the loss times the scale
    else:
        loss.backward()


def view_later_inputs(first: dict, later: list[dict], marks) -> None:
    """What each micro-batch after the traced two keeps: its forward takes views of some of its inputs (a
    classifier's loss reads `labels.view(-1)`), and the ledger counts a view's storage from then on, which
    Trainer's `batch_samples` keeps alive to the step's end (every micro-batch of a step is fetched before the
    first; a CPU job's batch is the model's input). Taken before the traced second micro-batch, which stands
    for the last: a view of each later input whose counterpart in the first micro-batch was viewed."""
    for batch in later:
        for key, t in batch.items():
            if marks.viewed(first[key]):
                t.view_as(t)


def training_step(model, optimizer, batches, setup, marks=NO_MARKS, forward_contexts=None,
                  loop: TrainerLoop | None = None) -> None:
    """What MemsweepTrainer does between on_step_begin and on_step_end for one optimizer step (its own
    fp16 autocast on the CPU wraps the whole call, see trainer.py; Accelerate's is in model.forward).
    `forward_contexts` stand in for the setup's where the trace runs them otherwise (fake.save_on_host);
    `loop` is what Trainer's loop keeps from the step before (a new one: none)."""
    dtype, accumulation = setup.autocast_dtype, setup.accumulation_steps
    loop = loop or TrainerLoop()
    run = batches[:RUN_MICRO_BATCHES]
    for n, batch in enumerate(run):
        with sharded.no_sync(model, sync=n == len(run) - 1):
            marks.mark("forward")
            if n == len(run) - 1:  # the micro-batch that stands for the step's last
                view_later_inputs(run[0], batches[len(run):], marks)
            with contextlib.ExitStack() as stack:
                if dtype is not None:
                    stack.enter_context(torch.autocast("cpu", dtype=dtype))
                for make_context in setup.forward_contexts if forward_contexts is None else forward_contexts:
                    stack.enter_context(make_context())
                loss = model(**batch).loss
            loss = loss / accumulation  # Trainer.training_step (MemsweepTrainer.loss_is_scaled_for_ga is False)
            marks.mark("backward")
            backward(loss, setup)
            marks.tag_grads(model)
        loop.after_micro_batch(loss, batch, setup)
    marks.mark("step")
    if optimizer is not None:
        found_inf = None
        if setup.args.get("max_grad_norm", 0) > 0:
            if scales_loss(setup):
                # GradScaler.unscale_ (torch/amp/grad_scaler.py), which clipping calls first (MemsweepTrainer's
                # _clip_grad_norm, Accelerate's clip_grad_norm_): its copy of found_inf on the device is kept in
                # the scaler's per-optimizer state until the optimizer step's update()
                found_inf = torch.zeros(())
            loop.grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), setup.args["max_grad_norm"])
        optimizer.step()
        del found_inf
    model.zero_grad()
    marks.mark("end")



def state_bytes(optimizer) -> int:
    """Bytes of optimizer state, each tensor once (optimizer_state_bytes dedupes by data pointer,
    which is 0 for every fake tensor; bitsandbytes gives every parameter's state the same two maps).
    FSDP's DTensor state counts this rank's shard, torchao's low-bit state its codes, scales and map."""
    unique = {id(t): t for s in inner_optimizer(optimizer).state.values() for v in s.values()
              for t in plain_tensors(v)}
    return sum(t.untyped_storage().nbytes() for t in unique.values())
