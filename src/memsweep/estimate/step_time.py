"""The predicted time of one optimizer step (roofline.step_time) and its parts, typed: what an estimate holds
as its `step_time` and writes into estimate.json (to_dict: the keys it has always written, in their order).
How each part is predicted: docs/estimator/step-time.md."""
from dataclasses import dataclass
from typing import Any

from .collectives import Collectives
from .host_copies import HostCopies


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """One optimizer step: `step_s`, None with `why_not` where it cannot be predicted. Its parts are None where
    the step was not timed at all (no memory bandwidth, or offload's copies without a host link); where a part
    of the step cannot be timed (a missing peak rate) they are there and `step_s` is None."""
    step_s: float | None
    why_not: str | None = None
    forward_s: float | None = None  # one micro-batch's forward
    backward_s: float | None = None  # ... and its backward, with checkpointing's recomputation
    forward_only_s: float | None = None  # one micro-batch's forward alone, as an evaluation batch runs it
    accumulate_s: float | None = None  # each micro-batch after the first adding its gradients into the first's
    optimizer_s: float | None = None  # the optimizer step on the device (0 where it steps on the host)
    host_transfer_s: float | None = None  # activation offload's copies to the host and back
    accumulation_steps: int | None = None
    device_s: float | None = None  # the device's work: every micro-batch's ops, the adds and the optimizer step
    dispatch_s: float | None = None  # the host's calls of those ops
    paged_in_s: float | None = None  # a CPU paging in the large tensors it makes anew
    idle_s: float | None = None  # the device waiting for launches
    bound: str | None = None  # "host dispatch" or "device": which of the two is longer
    ops_per_micro_batch: int | None = None  # forward and backward
    ops_accumulating: int | None = None  # the adds of one micro-batch after the first
    ops_recomputed: int | None = None  # backward's ops that recompute the forward (activation checkpointing)
    modules_walked: int | None = None  # what Trainer walks each micro-batch
    ops_in_optimizer_step: int | None = None
    gpu_us_per_op: float | None = None  # a micro-batch's device time per op (None: no ops)
    compute_bound_share: float | None = None  # of the ops' time, what their FLOPs bound
    rates: str | None = None  # where the rates come from
    method: str | None = None
    collectives: Collectives | None = None  # several processes'
    host_copies: HostCopies | None = None  # optimizer offload's
    note: str | None = None  # every part left out (a lower bound)

    def to_dict(self) -> dict[str, Any]:
        """estimate.json's `step_time`, as it has always been written: a step never timed has its reason alone;
        a timed one every part, then the collectives' and the host copies' keys where there are any, then
        why_not and the note. Where the collectives are not timed the note stands after their bytes, in the
        place their own note had before the step's notes were joined."""
        if self.method is None:
            return {"step_s": self.step_s, "why_not": self.why_not}
        out = {"step_s": self.step_s, "forward_s": self.forward_s, "backward_s": self.backward_s,
               "forward_only_s": self.forward_only_s, "accumulate_s": self.accumulate_s,
               "optimizer_s": self.optimizer_s, "host_transfer_s": self.host_transfer_s,
               "accumulation_steps": self.accumulation_steps, "device_s": self.device_s, "dispatch_s": self.dispatch_s,
               "paged_in_s": self.paged_in_s, "idle_s": self.idle_s, "bound": self.bound,
               "ops_per_micro_batch": self.ops_per_micro_batch, "ops_accumulating": self.ops_accumulating,
               "ops_recomputed": self.ops_recomputed, "modules_walked": self.modules_walked,
               "ops_in_optimizer_step": self.ops_in_optimizer_step, "gpu_us_per_op": self.gpu_us_per_op,
               "compute_bound_share": self.compute_bound_share, "rates": self.rates, "method": self.method}
        if self.collectives is not None:
            out["collective_bytes"] = self.collectives.sent_bytes
            if self.collectives.took_s is None:
                out["note"] = self.note
            else:
                out.update(collectives_s=self.collectives.took_s, collectives_waited_s=self.collectives.waited_s,
                           collectives_link=self.collectives.link)
        if self.host_copies is not None:
            out.update(host_copy_bytes=self.host_copies.sent_bytes, host_copies_s=self.host_copies.took_s,
                       host_copies_waited_s=self.host_copies.waited_s)
        if self.why_not is not None:
            out["why_not"] = self.why_not
        if self.note is not None:
            out["note"] = self.note  # last, unless it already stands after the collectives' bytes
        return out
