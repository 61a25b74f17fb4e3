"""transformers' Trainer with the setup applied, and the engine's known traps caught.

Caught here: the loss of gradient accumulation never divided (transformers#47688), fp16 and FSDP silently
dropped on the CPU by Accelerate, a host sync per micro-batch to count tokens, evaluation without a "begin"
event, padding (length buckets; the ledger step padded to `max_seq_len`), and a stop that ends training after
the optimizer step in progress while DataLoader workers ignore the signal.

Each trap and what is done about it: docs/guide/running.md.
"""
import math
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import Sampler
from transformers import Trainer, TrainerCallback

from ..measure.optimizer_state import inner_optimizer
from ..techniques import offload, optim
from . import stopping
from .lengths import length_bucketed_order
from .model import pad_token_id
from .setup import Setup


class LengthBucketSampler(Sampler):
    """Shuffle, cut into chunks of `bucket` batches, sort each chunk by length, shuffle the batches.

    Every example is seen once per epoch; a batch holds examples of similar length.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int, bucket: int = 50):
        self.lengths, self.batch_size, self.seed, self.bucket = lengths, batch_size, seed, bucket
        self.epoch = 0

    def __len__(self):
        return len(self.lengths)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        yield from length_bucketed_order(self.lengths, self.batch_size, self.seed + self.epoch, self.bucket)


def pad_batch(batch: dict, length: int, pad_token_id: int) -> dict:
    """Right-pad every sequence tensor of a collated batch to `length` (masked, so outputs are unchanged)."""
    out = dict(batch)
    for key, value in batch.items():
        if torch.is_tensor(value) and value.dim() == 2 and value.shape[1] < length:
            fill = pad_token_id if key == "input_ids" else -100 if key == "labels" else 0  # -100: no loss
            out[key] = F.pad(value, (0, length - value.shape[1]), value=fill)
    return out


class MemsweepTrainer(Trainer):
    # The model's loss is a mean over its micro-batch: Trainer must divide it by the accumulation steps.
    loss_is_scaled_for_ga = False

    def __init__(self, *args, setup: Setup, pad_to: int, pad_measured_step, **kwargs):
        super().__init__(*args, **kwargs)
        self.setup = setup
        self.pad_to = pad_to
        self.pad_measured_step = pad_measured_step  # global step (1-based) whose batches are padded
        self.model_accepts_loss_kwargs = False  # do not pass num_items_in_batch to the model
        self._tokens_pending = None  # non-padding tokens since the last read, a device tensor
        if setup.grad_scaler:
            # Read by Accelerate: backward scales the loss, the wrapped optimizer steps through it.
            self.accelerator.scaler = torch.amp.GradScaler(setup.device)

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        if self.args.fsdp_plugin_args is not None and not self.is_fsdp_enabled:
            restore_fsdp_plugin(self.accelerator, self.args.fsdp_plugin_args)
            self.is_fsdp_enabled = True

    def autocast_smart_context_manager(self, cache_enabled=True):
        if self.setup.autocast_dtype is None:
            return super().autocast_smart_context_manager(cache_enabled)
        return torch.autocast(self.setup.device, dtype=self.setup.autocast_dtype, cache_enabled=cache_enabled)

    def compute_loss_context_manager(self):
        stack = super().compute_loss_context_manager()
        for make_context in self.setup.forward_contexts:
            stack.enter_context(make_context())
        return stack

    def create_optimizer(self, model=None):
        if self.optimizer is None and self.setup.techniques.offload.optimizer:
            model = model if model is not None else self.model
            cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, model)
            groups = optim.param_groups(model, set(self.get_decay_parameter_names(model)), self.args.weight_decay)
            self.optimizer = offload.offloaded_optimizer(cls, [g for g in groups if g["params"]], kwargs,
                                                         grads=self.setup.techniques.offload.grads)
        return super().create_optimizer(model)

    def _clip_grad_norm(self, model):
        if self.setup.grad_scaler:  # clip the true gradients, not the scaled ones
            self.accelerator.scaler.unscale_(inner_optimizer(self.optimizer))
        return super()._clip_grad_norm(model)

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if not self.setup.group_by_length or self.args.world_size > 1 or not _has_tokens(dataset):
            return super()._get_train_sampler(train_dataset)
        lengths = [len(x) for x in dataset["input_ids"]]
        step_batch = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
        return LengthBucketSampler(lengths, step_batch, seed=self.args.seed)

    def _get_eval_sampler(self, eval_dataset):
        # Longest first, in order: predictions and labels stay aligned, and batches carry little padding.
        if not self.setup.group_by_length or self.args.world_size > 1 or not _has_tokens(eval_dataset):
            return super()._get_eval_sampler(eval_dataset)
        lengths = [len(x) for x in eval_dataset["input_ids"]]
        return sorted(range(len(lengths)), key=lambda i: -lengths[i])

    def _track_num_input_tokens(self, inputs):
        mask = inputs.get("attention_mask")
        if self.args.world_size > 1 or self.args.include_num_input_tokens_seen != "non_padding" or mask is None:
            return super()._track_num_input_tokens(inputs)  # gathered across processes: stock path
        count = mask.sum()
        self._tokens_pending = count if self._tokens_pending is None else self._tokens_pending + count

    def tokens_seen(self) -> int:
        if self._tokens_pending is not None:
            self.state.num_input_tokens_seen += int(self._tokens_pending.item())
            self._tokens_pending = None
        return self.state.num_input_tokens_seen

    def log(self, logs, start_time=None):
        self.tokens_seen()  # logs carry the count; Trainer syncs here for the loss anyway
        return super().log(logs, start_time)

    def evaluation_loop(self, dataloader, *args, **kwargs):
        # Trainer's first event of an evaluation comes after its first batch; the progress display
        # (progress.PhaseProgress) starts here so its time and ETA count that batch too.
        for callback in self.callback_handler.callbacks:
            if hasattr(callback, "on_evaluation_begin"):
                callback.on_evaluation_begin(self.args, self.state, self.control, eval_dataloader=dataloader)
        return super().evaluation_loop(dataloader, *args, **kwargs)

    def get_train_dataloader(self):
        return _workers_leave_stops_to_the_job(super().get_train_dataloader())

    def get_eval_dataloader(self, eval_dataset=None):
        return _workers_leave_stops_to_the_job(super().get_eval_dataloader(eval_dataset))

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.state.global_step + 1 == self.pad_measured_step:
            pad_id = pad_token_id(self.model.config, self.processing_class)
            batches = [pad_batch(b, self.pad_to, pad_id) for b in batches]
        return batches, num_items


def _has_tokens(dataset) -> bool:
    """Sequences of tokens, whose lengths differ (images are all the model's size: nothing to bucket)."""
    return "input_ids" in (getattr(dataset, "column_names", None) or ())


def _workers_leave_stops_to_the_job(loader):
    workers = vars(loader).get("base_dataloader", loader)  # Accelerate's wrapper iterates the DataLoader it holds
    if workers.num_workers:
        workers.worker_init_fn = stopping.leave_stops_to_the_job(workers.worker_init_fn)
    return loader


def restore_fsdp_plugin(accelerator, plugin_args: dict) -> None:
    """Make Accelerate treat a CPU job (distributed type MULTI_CPU) as FSDP, as it would on a GPU."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU:
        raise RuntimeError(f"FSDP was asked for but Accelerate chose {state.distributed_type}, not FSDP")
    plugin = FullyShardedDataParallelPlugin(**plugin_args)
    if state.mixed_precision != "no":  # as Accelerate does for its FSDP plugin on a GPU
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    if plugin.fsdp_version == 1:
        # Accelerate passes its device as FSDP1's device_id, "cpu:0" for a CPU rank, which torch compares with
        # the parameters' "cpu" and refuses (fsdp/_init_utils.py, _get_compute_device: "Inconsistent compute
        # device"): the same device, named as the parameters name it
        state.device = torch.device("cpu")


class DivergenceCallback(TrainerCallback):
    """Stop at the first logged NaN/inf loss (checked only when Trainer logs: no per-step host sync)."""

    def __init__(self):
        self.diverged_at = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(loss):
            self.diverged_at = state.global_step
            control.should_training_stop = True


class StopCallback(TrainerCallback):
    """A stop asked for (stopping.py) ends training at the end of the optimizer step in progress, through
    Trainer's own control: the step completes, Trainer leaves its loop and returns what it trained."""

    def __init__(self):
        self.stopped_at = None

    def on_step_end(self, args, state, control, **kwargs):
        if stopping.requested() is not None:
            self.stopped_at = state.global_step
            control.should_training_stop = True


class BeforeTraining(TrainerCallback):
    """The evaluation Trainer runs before the first step (eval_on_start: after the model and optimizer are
    prepared, so it works under DeepSpeed and FSDP too): its metrics, and 4-bit weights made trainable again."""

    def __init__(self):
        self.metrics = None

    def on_evaluate(self, args, state, control, model=None, metrics=None, **kwargs):
        if state.global_step == 0 and self.metrics is None:
            self.metrics = dict(metrics or {})
            unpack_4bit_for_training(model)


def unpack_4bit_for_training(model) -> None:
    """An eval-mode forward on a CPU with AVX512-BF16 repacks bitsandbytes' 4-bit weights for its inference
    kernel, a layout its training path cannot use: put them back, as bitsandbytes' own save path does (a round
    trip that is not bit-exact: the packed layout keeps the block scales in lower precision)."""
    if model is None or "bitsandbytes" not in sys.modules:
        return
    from bitsandbytes.nn.modules import Linear4bit, _convert_weight_packed_for_cpu_inverse

    for module in model.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if isinstance(module, Linear4bit) and getattr(state, "packing_format_for_cpu", False):
            module.weight.data, module.weight.quant_state = _convert_weight_packed_for_cpu_inverse(
                module.weight.data, state)


class WandbLogCallback(TrainerCallback):
    """Trainer's logs (loss, lr, grad norm) to the run, by optimizer step."""

    def __init__(self, run):
        self.run = run

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run is not None and logs:
            self.run.log({f"train/{k}": v for k, v in logs.items() if isinstance(v, (int, float))},
                         step=state.global_step)
