"""LedgerTracker on a model small enough to count by hand, and the private parts of torch's MemTracker
it overrides or reads: a torch that renames them fails here, with a message naming what went missing."""
import inspect

import pytest
import torch
from torch import nn
from torch.distributed._tools import mod_tracker
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.distributed._tools.mod_tracker import ModTracker

from memsweep.measure.ledger import CATEGORIES, LedgerTracker, _NoHook
from memsweep.measure.optimizer_state import optimizer_state_bytes, paged_state_bytes

BATCH, IN, HIDDEN, OUT = 8, 16, 32, 4
F32 = 4  # bytes per float32 value

FROZEN_PARAMS = IN * HIDDEN + HIDDEN  # first Linear: weight + bias, requires_grad=False
TRAINABLE_PARAMS = HIDDEN * OUT + OUT  # second Linear
# Held for backward when the model's forward ends: the ReLU output (the second Linear's saved input)
# and the logits. The first Linear's output is freed by the ReLU: nothing before it needs a gradient.
SAVED_ACTIVATIONS = F32 * (BATCH * HIDDEN + BATCH * OUT)
# AdamW: exp_avg and exp_avg_sq per trainable value, plus a float32 `step` scalar per parameter tensor.
ADAMW_STATE = F32 * (2 * TRAINABLE_PARAMS + 2)

# What LedgerTracker overrides (with the parameters it passes or receives) and what it reads.
OVERRIDDEN = {
    "_update_peak_stats": ["self", "peak_state"],
    "_pre_fw_hook": ["self", "module", "inputs"],
    "_post_fw_hook": ["self", "module", "inputs", "outputs"],
    "_track_module_params_and_buffers": ["self", "module", "install_grad_hooks"],
}
CALLED = ["track_external", "get_tracker_snapshot", "reset_mod_stats", "__enter__", "__exit__"]
INSTANCE_FIELDS = ["_curr_mem_snap", "_peak_mem", "_peak_mem_snap", "_param_to_grad_hook_handles", "_mod_tracker",
                   "memory_tracking"]
MOD_TRACKER = ["is_bw", "parents", "get_known_fqn"]


def small_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
    model[0].requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return model, optimizer


def batch(size=BATCH):
    return torch.randn(size, IN), torch.randint(0, OUT, (size,))


def loss_of(model, x, y):
    return nn.functional.cross_entropy(model(x), y)


def warm_up(model, optimizer):
    # The measured step then starts as a Trainer step does: optimizer state made, gradients freed.
    loss_of(model, *batch()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_memtracker_still_has_what_ledgertracker_relies_on():
    for name, params in OVERRIDDEN.items():
        assert hasattr(MemTracker, name), f"torch's MemTracker has no {name} any more: LedgerTracker overrides it"
        got = list(inspect.signature(getattr(MemTracker, name)).parameters)
        assert got == params, f"MemTracker.{name}{tuple(got)}: LedgerTracker expects {tuple(params)}"
    for name in CALLED:
        assert callable(getattr(MemTracker, name, None)), f"torch's MemTracker has no {name} any more"
    tracker = MemTracker()
    for name in INSTANCE_FIELDS:
        assert hasattr(tracker, name), f"torch's MemTracker no longer sets self.{name}: LedgerTracker reads it"
    assert isinstance(tracker._mod_tracker, ModTracker)
    assert callable(getattr(mod_tracker, "register_multi_grad_hook", None)), \
        "torch's mod_tracker no longer calls register_multi_grad_hook: LedgerTracker removes the hooks it makes"
    for name in MOD_TRACKER:
        assert hasattr(tracker._mod_tracker, name), f"torch's ModTracker has no {name} any more"
    # measure.CATEGORIES names the snapshot keys: a renamed category would vanish from every breakdown
    assert {t.value for t in _MemRefType} == set(CATEGORIES)


@pytest.mark.fast
def test_one_step_is_counted_to_the_byte():
    model, optimizer = small_model()
    warm_up(model, optimizer)
    x, y = batch()
    tracker = LedgerTracker(root=model)
    tracker.track_external(model, optimizer)
    with tracker:
        loss = loss_of(model, x, y)
        hooks = {name: tracker._param_to_grad_hook_handles.get(p) for name, p in model.named_parameters()}
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # the frozen layer got the placeholder, the trainable one real gradient hooks
    assert all(isinstance(h, _NoHook) for name in ("0.weight", "0.bias") for h in hooks[name])
    assert all(isinstance(h, torch.utils.hooks.RemovableHandle) for name in ("2.weight", "2.bias")
               for h in hooks[name])

    (device, peak), = tracker.get_tracker_snapshot("peak").items()
    assert device.type == "cpu"
    assert peak["Parameter"] == F32 * (FROZEN_PARAMS + TRAINABLE_PARAMS)
    assert peak["Total"] == sum(v for k, v in peak.items() if k != "Total")
    assert peak["Total"] == tracker._peak_mem[device]
    # gradients only for the trainable layer; seen by the grad hooks the frozen parameter did not break
    assert tracker.category_max["Gradient"] == F32 * TRAINABLE_PARAMS
    assert tracker.saved_activations == SAVED_ACTIVATIONS
    assert optimizer_state_bytes(optimizer) == ADAMW_STATE
    # MemTracker counts everything allocated inside optimizer.step() as optimizer state, temporaries included
    assert tracker.category_max["Optstate"] >= ADAMW_STATE
    # the per-category maxima bound the peak's parts
    assert all(tracker.category_max.get(k, 0) >= v for k, v in peak.items())


def test_paged_optimizer_state_is_counted_apart():
    # bitsandbytes' paged optimizers make large state buffers with F.get_paged, which marks them `is_paged`:
    # unified memory outside PyTorch's allocator, so out of the device's optimizer bytes (as in the estimate)
    model, optimizer = small_model()
    warm_up(model, optimizer)
    weight = model[2].weight
    optimizer.state[weight]["exp_avg"].is_paged = True
    assert paged_state_bytes(optimizer) == F32 * HIDDEN * OUT
    assert optimizer_state_bytes(optimizer) == ADAMW_STATE - F32 * HIDDEN * OUT


def test_accumulated_micro_batches_are_one_tracked_step():
    model, optimizer = small_model()
    warm_up(model, optimizer)
    # made before the tracker starts (only the model's own tensors count); the smaller one last, so the
    # activations kept are the largest micro-batch's, not the last one's
    micro_batches = [batch(), batch(BATCH // 2)]
    tracker = LedgerTracker(root=model)
    tracker.track_external(model, optimizer)
    with tracker:
        for x, y in micro_batches:  # the root module is called again before the optimizer step
            loss_of(model, x, y).backward()
        optimizer.step()
    # while the second micro-batch's gradients are added to the first's, both are alive for a moment
    assert F32 * TRAINABLE_PARAMS < tracker.category_max["Gradient"] <= 2 * F32 * TRAINABLE_PARAMS
    assert tracker.saved_activations == SAVED_ACTIVATIONS


# The refusal this test provokes raises inside torch's global forward hook; torch then warns that it silenced it
@pytest.mark.filterwarnings("ignore:global module forward hook with ``always_call=True`` raised:UserWarning")
def test_stock_memtracker_refuses_what_ledgertracker_handles():
    # Why the overrides exist: if torch lifts these limits they can go.
    model, optimizer = small_model()
    warm_up(model, optimizer)
    stock = MemTracker()
    stock.track_external(model, optimizer)
    with pytest.raises(RuntimeError, match="doesn't require gradient"), stock:
        loss_of(model, *batch())

    model.requires_grad_(True)
    stock = MemTracker()
    stock.track_external(model, optimizer)
    with pytest.raises(NotImplementedError, match="multiple iterative calls"), stock:
        for _ in range(2):
            loss_of(model, *batch()).backward()


def test_a_job_leaves_no_model_behind(tiny_job, monkeypatch):
    """Every job of an in-process sweep frees its model: the tracker's autograd hooks would otherwise keep
    each job's parameters (and on a GPU their memory) for the rest of the process."""
    import gc
    import weakref

    from memsweep.run import model as model_mod

    loaded = []
    load = model_mod.load_model
    monkeypatch.setattr(model_mod, "load_model", lambda *a, **k: loaded.append(m := load(*a, **k)) or m)
    tiny_job("max_steps=2", "measure.estimate=false")
    assert len(loaded) == 1 and mod_tracker.register_multi_grad_hook is torch.autograd.graph.register_multi_grad_hook
    weights = [weakref.ref(p) for p in loaded.pop().parameters()]
    gc.collect()
    assert not [w for w in weights if w() is not None]
