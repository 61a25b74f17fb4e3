"""What Lightning's `FSDPStrategy` (FSDP1, `FullyShardedDataParallel`, with `use_orig_params=True` on torch
>= 2.0) holds on a GPU beyond what memsweep's `fsdp.version=1` estimate (estimate/sharded.py) already models,
for published tables measured with it (older_libraries.py names when each applies). Each is a documented
behaviour of Lightning's or FSDP1's code, modelled on the trace of the same units; nothing is fitted to a table.

- FSDP1 itself is memsweep's: its units (the root holding embeddings, final norm and head, not freed after its
  forward) and its flat parameters (a unit holding a trainable parameter gets a gradient for all of them,
  made by concatenating its views' gradients: `sharded.flat_gradients` and `sharded.concatenated`, with their
  sources). A row of such a table is estimated as `fsdp.version=1`.
- Lightning's units. Its auto_wrap_policy names the Block class alone (lit-gpt's `{Block}`, Raschka's
  `{EncoderBlock}`): a LoRA layer stays inside its block's FlatParameter, so every block gets a whole gradient
  (Lightning-AI/litgpt issue #1417 and PR #1538), where Trainer's peft policy gives LoRA's layers units of their
  own (transformers' update_fsdp_plugin_peft). Under `no_sync` (every micro-batch but an accumulated step's
  last) FSDP1 keeps those gradients unsharded until the last micro-batch reduces them. A FlatParameter holds
  one dtype (fsdp/_flat_param.py: "Must flatten tensors with uniform dtype"): lit-gpt's bf16-true creates the
  adapters in bf16, so peft's fp32 adapters are estimated in the frozen weights' dtype.
- No rate limiter before torch's nightly of 2023-07-11 (`limit_all_gathers` defaulted to False until
  pytorch/pytorch PR #104900, "[FSDP] Default `limit_all_gathers=True`": torch 2.0.x and the 2.1 nightlies
  before it; Lightning's FSDPStrategy passes none of its own). FSDP1 frees a unit's unsharded flat
  parameter after its forward and backward with `record_stream` on the computation stream (flat_param.py,
  `_free_unsharded_flat_param`: it was gathered on the all-gather stream), and the unsharded gradient after
  its reduce-scatter with `record_stream` on the post-backward stream (`_post_backward_hook`: "the unsharded
  gradient is produced in the computation stream and consumed in the post-backward stream"). The caching
  allocator reuses such a block only once the other stream has passed the free (allocator.py:
  free_requested ... free_completed). The rate limiter made the host wait for the GPU after two
  all-gathers; without it the host runs ahead of the GPU (the cudaMalloc retries and "issue all-gathers way
  in advance" of pytorch/pytorch issue #104509), so every unit's buffers freed meanwhile wait. Modelled at
  the bound: FSDP's unsharded parameters and gradients freed in a micro-batch are reused only after it,
  where the tables' scripts next read a result on the host (torchmetrics' update of the train accuracy at
  the end of each pass of their loop, after optimizer.step() where it steps). FSDP2's own all-gather and
  reduce-scatter buffers, which FSDP1 does not make, are traced as FSDP2 makes them.
- CPU offload (`cpu_offload=True`), in that same run-ahead. Each unit's shard is copied to the device for
  its all-gather (FlatParamHandle.pre_unshard, `flat_param_to(self.device)`), the all-gather's input, which
  ProcessGroupNCCL records on its own stream ("both must record the ncclStream to prevent being freed before
  the collective finishes", ProcessGroupNCCL::collective; TORCH_NCCL_AVOID_RECORD_STREAMS off): it waits
  as the unsharded buffers do. Each sharded gradient stays on the device as `_saved_grad_shard` until
  backward ends (`prepare_gradient_for_optim` deletes it once the host copy `_cpu_grad` is the gradient);
  the step before's gradients are on the host.
"""
import collections
import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from memsweep.estimate.events import Event
from patching import patched


@contextlib.contextmanager
def flat_unit_gradients() -> Iterator[None]:
    """Lightning's FSDPStrategy (see the module): the job estimated as `fsdp.version=1` (a row's job that still
    says 2 too), with the Block class alone as the units and the model's parameters in one dtype."""
    import memsweep.estimate.sharded as sharded

    shard = sharded.shard

    def lightnings(model, plugin_args, *args):
        dtype = collections.Counter(dtypes(model)).most_common(1)[0][0]
        for p in model.parameters():
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)
        return shard(model, as_fsdp1(plugin_args), *args)

    with patched([(sharded, "shard", lightnings), (sharded, "fsdp1_policy", blocks_only)]):
        yield


def as_fsdp1(plugin_args: dict) -> dict:
    """FSDP2 plugin arguments as the FSDP1 ones memsweep's fsdp.version=1 gives (techniques/fsdp.py)."""
    if plugin_args["fsdp_version"] == 1:
        return plugin_args
    strategy = "full_shard" if plugin_args["reshard_after_forward"] else "shard_grad_op"
    return {**plugin_args, "fsdp_version": 1, "reshard_after_forward": strategy, "use_orig_params": True,
            "sync_module_states": False}


def blocks_only(model, plugin_args: dict):
    """The plugin's transformer policy (the job's block class), for a peft model too (see the module)."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(**plugin_args)
    plugin.set_auto_wrap_policy(model)
    return plugin.auto_wrap_policy


def dtypes(model) -> list[Any]:
    """The floating-point dtype of each parameter."""
    return [p.dtype for p in model.parameters() if p.is_floating_point()]


class HostAhead:
    """The recorder's hooks for FSDP1 without its rate limiter (see the module): the blocks FSDP frees on
    another stream (`other_stream`: the storages it resizes, the reduce-scatter's inputs) are requested free
    when the step drops them and completed as the next micro-batch begins or the step ends; each all-gather's
    shard bytes are noted as a ("gather", nbytes) event, the device copy CPU offload makes (offloaded)."""

    def __init__(self, recorder_class):
        self.recorder_class, self.recorder = recorder_class, None
        self.resized, self.release = recorder_class.resized, recorder_class.release
        self.mark, self.enter, self.exit = recorder_class.mark, recorder_class.__enter__, recorder_class.__exit__

    def patches(self) -> list[tuple[Any, str, Any]]:
        hooks = self

        def entering(recorder):
            hooks.recorder, recorder.other_stream, recorder.awaiting = recorder, set(), []
            return hooks.enter(recorder)

        def exiting(recorder, *exc):
            hooks.recorder = None  # a later trace's warm-up is not recorded
            return hooks.exit(recorder, *exc)

        def resizing(recorder, storage):
            hooks.resized(recorder, storage)
            recorder.other_stream.add(recorder.seen[storage].key)  # None where resized to nothing

        def releasing(recorder, block):
            if block.key is not None and block.key in recorder.other_stream:
                recorder.events.append(Event.free_requested(block.key))
                recorder.awaiting.append(block.key)
                block.key = None
            hooks.release(recorder, block)

        def marking(recorder, name):
            if name in ("forward", "end"):  # the scripts' loop reads a result on the host once per micro-batch
                recorder.events += [Event.free_completed(key) for key in recorder.awaiting]
                recorder.awaiting = []
            hooks.mark(recorder, name)

        hooked = (("__enter__", entering), ("__exit__", exiting), ("resized", resizing), ("release", releasing),
                  ("mark", marking))
        return [(self.recorder_class, name, hook) for name, hook in hooked]

    def reducing(self, copy_in):
        def copying_in(unsharded_grads, *args, **kwargs):
            for grad in unsharded_grads if self.recorder else ():
                block = self.recorder.seen.get(grad.untyped_storage())
                self.recorder.other_stream.add(block.key if block is not None else None)
            return copy_in(unsharded_grads, *args, **kwargs)
        return copying_in

    def gathering(self, gather):
        def noting(fsdp_params, *args, **kwargs):
            if self.recorder:
                nbytes = sum(p._sharded_param_data.untyped_storage().nbytes() for p in fsdp_params)
                self.recorder.events.append(gather_event(nbytes))
            return gather(fsdp_params, *args, **kwargs)
        return noting


@contextlib.contextmanager
def host_ahead() -> Iterator[None]:
    """While a row is estimated: FSDP1 without its rate limiter, and its CPU offload (see the module)."""
    import torch.distributed.fsdp._fully_shard._fsdp_collectives as collectives
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as group

    import memsweep.estimate.capture as capture
    import memsweep.estimate.trace as trace

    hooks, apply = HostAhead(capture.Recorder), trace.adjust.apply

    def applying(events, categories, adjustment, *args, **kwargs):
        if {"params", "grads"} <= adjustment.host and adjustment.zero is None:  # FSDP's CPU offload
            events, categories = offloaded(events, categories)
            adjustment = dataclasses.replace(adjustment, host=adjustment.host - {"grads"} | {"host"})
        return apply(events, categories, adjustment, *args, **kwargs)

    with patched(hooks.patches() + [
            (collectives, "foreach_reduce_scatter_copy_in", hooks.reducing(collectives.foreach_reduce_scatter_copy_in)),
            (group, "foreach_all_gather", hooks.gathering(group.foreach_all_gather)),
            (trace.adjust, "apply", applying)]):
        yield


def gather_event(nbytes: int) -> Event:
    """An all-gather of unit shards of `nbytes` in all (recorded while FSDP1's CPU offload is modelled, for
    `offloaded`: the allocator model and the readings pass over it)."""
    return Event("gather", nbytes=nbytes)


def offloaded(events: list[Event], categories: dict) -> tuple[list[Event], dict]:
    """A step traced without offload, as FSDP1's CPU offload runs it (see the module): the gradients alive as it
    starts are on the host; each all-gather's input is the unit's shard copied to the device, which NCCL's
    stream holds until the micro-batch's end; the sharded gradients backward makes stay on the device."""
    first = events.index(Event.mark("forward"))
    host = {e.key: "host" for e in events[:first] if e.kind == "alloc" and categories.get(e.key) == "grads"}
    out, copies, made = [], [], []
    for event in events:
        if event.kind == "gather":
            copies.append(("shard copy", len(made)))
            made.append(copies[-1])
            out += [Event.alloc(copies[-1], event.nbytes), Event.free_requested(copies[-1])]
            continue
        if event.is_mark("forward") or event.is_mark("end"):
            out += [Event.free_completed(key) for key in copies]
            copies = []
        out.append(event)
    return out, {**categories, **host, **{key: "activations" for key in made}}
