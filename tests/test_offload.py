"""offload: what each option keeps in host memory, in the real job's optimizer and in the estimate."""
import pytest
import torch

from conftest import TINY, build_job, job_of
from memsweep.estimate.core import estimate_job
from memsweep.techniques import offload

GPU = TINY + ["hardware=a100_40gb", "batch_size=4"]


@pytest.mark.parametrize("option, expected", [("none", (False, False, False)), ("activations", (True, False, False)),
                                              ("optimizer", (False, True, False)),
                                              ("optimizer_and_grads", (False, True, True))])
def test_each_option_says_what_lives_on_the_host(option, expected):
    job, _ = job_of(TINY + [f"offload={option}"])
    t = offload.traits(job.offload)
    assert (t.activations, t.optimizer, t.grads) == expected


def test_the_trainer_hands_its_optimizer_to_cpu_offload_with_trainers_groups(tmp_path, monkeypatch):
    # CPUOffloadOptimizer itself needs a CUDA GPU (the gpu test below); here its construction is caught
    seen = {}

    def offloaded(cls, groups, kwargs, grads):
        seen.update(cls=cls, groups=groups, kwargs=kwargs, grads=grads)
        return cls(groups, **kwargs)

    monkeypatch.setattr(offload, "offloaded_optimizer", offloaded)
    built = build_job(TINY + ["offload=optimizer_and_grads", "optim.weight_decay=0.01"], tmp_path)
    built.trainer.create_optimizer()
    model = built.trainer.model
    assert seen["cls"] is torch.optim.AdamW and seen["kwargs"]["fused"] is True and seen["grads"] is True
    decayed, plain = seen["groups"]
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.01, 0.0)
    assert {id(p) for g in seen["groups"] for p in g["params"]} == {id(p) for p in model.parameters()
                                                                     if p.requires_grad}
    # the host optimizer steps gradients copied before Trainer would clip them: clipping is off
    assert built.trainer.args.max_grad_norm == 0.0


def test_the_estimate_takes_the_optimizer_then_the_gradients_off_the_gpu():
    est = {o: estimate_job(*job_of(GPU + ["optim=adamw_torch", f"offload={o}"])).to_dict()
           for o in ("none", "optimizer", "optimizer_and_grads")}
    state, grads = est["none"]["optimizer_bytes"], est["none"]["grads_bytes"]
    assert state > 0 and grads > 0
    # no state and no step temporaries (the foreach AdamW's, as large as the gradients) on the device
    saved = est["none"]["peak_allocated_bytes"] - est["optimizer"]["peak_allocated_bytes"]
    assert saved >= state
    assert est["optimizer"]["breakdown"].get("optimizer", 0) == est["optimizer"]["breakdown"].get("temp", 0) == 0
    assert est["optimizer_and_grads"]["breakdown"].get("grads", 0) == 0
    assert est["optimizer_and_grads"]["peak_allocated_bytes"] < est["optimizer"]["peak_allocated_bytes"]
    assert "CPUOffloadOptimizer" in est["optimizer"]["method_reason"]
    # the device's forward and backward are timed, the host's step is not: a lower bound that says so
    assert 0 < est["optimizer"]["predicted_step_s"] < est["none"]["predicted_step_s"]
    assert "on the host" in est["optimizer"]["step_time"]["note"] and "note" not in est["none"]["step_time"]


@pytest.mark.gpu
def test_on_a_gpu_the_offloaded_job_holds_no_optimizer_state_there(tmp_path):
    from conftest import run_job

    res = {o: run_job(TINY + ["hardware=auto", "max_steps=2", f"offload={o}"], tmp_path / o)
           for o in ("none", "optimizer")}
    assert res["optimizer"]["status"] == "ok" and res["optimizer"]["effective"]["optimizer"] == "CPUOffloadOptimizer"
    saved = res["none"]["memory"]["peak_bytes"] - res["optimizer"]["memory"]["peak_bytes"]
    assert saved >= 0.9 * res["none"]["memory"]["optimizer_bytes"]


def test_the_ledger_reads_the_gpu_and_the_state_cpu_offload_leaves_there():
    # CPUOffloadOptimizer keeps no state of its own (it skips Optimizer.__init__): the state on the device
    # is its device optimizer's, for the tensors under 4,096 values; the host optimizers' is not counted
    from types import SimpleNamespace

    from torchao.optim import CPUOffloadOptimizer

    from memsweep.measure.ledger import ledger_reading
    from memsweep.measure.optimizer_state import on_device, optimizer_state_bytes

    small, large = torch.nn.Parameter(torch.ones(8)), torch.nn.Parameter(torch.ones(4096))
    offloaded = object.__new__(CPUOffloadOptimizer)  # its __init__ needs CUDA; these are the fields it sets
    offloaded.d_opt = torch.optim.AdamW([small])
    offloaded.optim_dict = {large: torch.optim.AdamW([large])}
    for p in (small, large):
        p.grad = torch.ones_like(p)
    offloaded.d_opt.step()
    offloaded.optim_dict[large].step()
    assert on_device(SimpleNamespace(optimizer=offloaded)) is offloaded.d_opt
    assert optimizer_state_bytes(offloaded) == 2 * 8 * 4 + 4  # two moments and the step count
    offloaded.d_opt = None
    assert optimizer_state_bytes(offloaded) == 0
    # the host's tracked tensors (offload's copies, the host optimizer) may outweigh the GPU's
    snaps = {torch.device("cpu"): {"Total": 9, "Parameter": 9}, torch.device("cuda", 0): {"Total": 5, "Parameter": 5}}
    tracker = SimpleNamespace(get_tracker_snapshot=lambda kind: snaps, saved_activations=0, category_max={})
    assert ledger_reading(tracker, 0).peak_bytes == 5


def test_a_finished_job_lets_go_of_the_weights_cpu_offloads_hooks_hold():
    # CPUOffloadOptimizer's shape (its __init__ needs CUDA): a post-accumulate-grad hook per parameter whose
    # closure holds the optimizer, whose map holds the parameters
    import gc
    import weakref

    class Offloading:
        def __init__(self, params):
            self.param_d2h_map = {p: None for p in params}
            for p in self.param_d2h_map:
                p.register_post_accumulate_grad_hook(lambda p_device: self.param_d2h_map[p_device])

    def weights_left(release: bool) -> int:
        model = torch.nn.Linear(64, 64)
        weights, optimizer = [weakref.ref(p) for p in model.parameters()], Offloading(model.parameters())
        model(torch.ones(2, 64)).sum().backward()
        if release:
            offload.release(model)
        del model, optimizer
        gc.collect()
        return sum(w() is not None for w in weights)

    assert weights_left(release=False) == 2  # the cycle runs through C++: gc alone keeps them
    assert weights_left(release=True) == 0


@pytest.mark.gpu
def test_on_a_gpu_an_offloaded_job_leaves_no_model_behind(tmp_path, monkeypatch):
    import gc
    import weakref

    from conftest import run_job
    from memsweep.run import model as model_mod

    loaded, load = [], model_mod.load_model
    monkeypatch.setattr(model_mod, "load_model", lambda *a, **k: loaded.append(m := load(*a, **k)) or m)
    res = run_job(TINY + ["hardware=auto", "max_steps=2", "offload=optimizer_and_grads"], tmp_path)
    assert res["status"] == "ok" and res["effective"]["optimizer"] == "CPUOffloadOptimizer"
    weights = [weakref.ref(p) for p in loaded.pop().parameters()]
    gc.collect()
    assert not [w for w in weights if w() is not None]
