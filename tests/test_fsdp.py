"""fsdp: FSDP2 through Trainer's fsdp_config; full_shard and shard_grad_op train on the CPU in one
process like plain PyTorch, offload is generated for GPUs and refused here by a rule."""
import os

import pytest
from omegaconf import OmegaConf

from conftest import TINY, compose_config, job_of, run_job, train_logging_every_step
from memsweep.config import hardware
from memsweep.run import procenv
from memsweep.run.setup import build_setup
from memsweep.run.train_loop import release, training_arguments

# One worker runs the whole module (`make test`: --dist loadgroup), so its module fixture's jobs run once.
pytestmark = pytest.mark.xdist_group("fsdp")

EXACT = TINY + ["model.dropout=0", "max_steps=4", "measure.ledger=false"]
WORD_EMBEDDING_BYTES = 30522 * 64 * 4  # model=tiny: vocab x hidden, fp32


def _setup(overrides):
    job = OmegaConf.to_object(compose_config(TINY + overrides))
    return job, build_setup(job, hardware.detect(job.hardware))


@pytest.mark.parametrize("option, reshard, offload", [("full_shard", True, False), ("shard_grad_op", False, False),
                                                      ("full_shard_offload", True, True)])
def test_each_option_becomes_trainers_fsdp2_plugin(tmp_path, option, reshard, offload):
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy

    job, setup = _setup([f"fsdp={option}"])
    # building the plan changes nothing in the process; the job enters a group of one as it builds
    assert setup.process_group and "WORLD_SIZE" not in os.environ
    try:
        procenv.enter_group_of_one()
        assert os.environ["WORLD_SIZE"] == "1"  # a one-process group, as DeepSpeed gets
        args = training_arguments(job, setup, tmp_path)
        plugin_args = args.fsdp_plugin_args
        assert plugin_args["fsdp_version"] == 2 and plugin_args["reshard_after_forward"] is reshard
        assert plugin_args.get("cpu_offload", False) is offload
        plugin = FullyShardedDataParallelPlugin(**plugin_args)
        assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) is offload
    finally:
        procenv.teardown()
    assert "WORLD_SIZE" not in os.environ


def test_no_fsdp_leaves_trainer_arguments_alone():
    _, setup = _setup([])
    assert "fsdp" not in setup.args and "fsdp_config" not in setup.args


def test_the_encoder_layer_is_the_wrapped_unit(tmp_path):
    try:
        job, setup = _setup(["fsdp=full_shard"])
        from memsweep.run import model as model_mod

        setup.transform(model_mod.load_model(job.model, 2, setup.load_kwargs))
        assert setup.args["fsdp_config"]["transformer_layer_cls_to_wrap"] == ["BertLayer"]
    finally:
        procenv.teardown()


def _train(overrides, job_dir):
    """Losses of 4 logged steps and the trained model (before evaluation)."""
    return train_logging_every_step(EXACT + overrides, job_dir)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    losses, built = _train([], tmp_path_factory.mktemp("plain"))
    release(built)
    return losses


@pytest.mark.parametrize("option, resharded", [("full_shard", True), ("shard_grad_op", False)])
def test_sharded_training_matches_plain_and_the_strategy_shows(tmp_path, reference, option, resharded):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    losses, built = _train([f"fsdp={option}"], tmp_path)
    try:
        model = built.trainer.model_wrapped
        assert isinstance(model, FSDPModule)  # not the DDP Accelerate picks on the CPU by itself
        assert all(isinstance(p, DTensor) for p in model.parameters())  # resharded after backward
        assert len(losses) == len(reference) == 4
        assert losses == pytest.approx(reference, abs=1e-5)
        # After a forward, full_shard has freed each layer's gathered weights; shard_grad_op keeps them.
        batch = next(iter(built.trainer.get_train_dataloader()))
        layer = model.bert.encoder.layer[0]
        out = model(**batch)
        assert isinstance(layer.attention.self.query.weight, DTensor) is resharded
        out.loss.backward()
    finally:
        release(built)


def test_fsdp_jobs_audit_the_sharding_measure_it_and_leave_the_process_clean(tmp_path):
    import torch.distributed as dist

    full = run_job(TINY + ["fsdp=full_shard", "max_steps=2"], tmp_path / "full")
    grad_op = run_job(TINY + ["fsdp=shard_grad_op", "max_steps=2"], tmp_path / "grad_op")
    plain = run_job(TINY + ["max_steps=2"], tmp_path / "plain")
    assert [r["status"] for r in (full, grad_op, plain)] == ["ok"] * 3

    audit = full["effective"]["fsdp"]
    params = full["effective"]["total_params"]
    assert audit["version"] == 2 and audit["world_size"] == 1 and not audit["offload"]
    assert audit["unit_classes"] == ["BertForSequenceClassification", "BertLayer", "Embedding"]
    assert audit["units"] == 4  # 2 layers, the word embeddings, the root
    assert audit["sharded_params"] == audit["params"] == 41
    assert audit["local_numel"] == audit["global_numel"] == params  # one process holds every shard
    assert audit["resharded_after_forward"] == 3  # all units but the root
    assert grad_op["effective"]["fsdp"]["resharded_after_forward"] == 0

    # The same training: one process holds every shard, so the results are plain training's.
    for key in ("train_loss", "eval_loss", "f1"):
        assert full["metrics"][key] == pytest.approx(plain["metrics"][key], abs=1e-5)
    # With the fused AdamW (no step temporaries) the peak is in forward, where FSDP holds the unit it has
    # gathered as well: a few percent more weights at that moment than the model's own.
    assert plain["memory"]["params_bytes"] == 4 * params <= full["memory"]["params_bytes"] <= 1.05 * 4 * params
    assert full["memory"]["optimizer_bytes"] == plain["memory"]["optimizer_bytes"]
    assert full["memory"]["optimizer_bytes"] == pytest.approx(8 * params, rel=1e-4)  # AdamW's two moments
    assert full["memory"]["peak_bytes"] == pytest.approx(plain["memory"]["peak_bytes"], rel=0.01)
    # shard_grad_op holds the gathered word embeddings from forward to backward.
    assert grad_op["memory"]["peak_bytes"] - full["memory"]["peak_bytes"] >= 0.9 * WORD_EMBEDDING_BYTES

    # Jobs after an FSDP job in the same process (a sweep) start clean.
    assert plain["effective"]["fsdp"] is None and plain["effective"]["deepspeed_stage"] is None
    assert not dist.is_initialized()
    assert "WORLD_SIZE" not in os.environ and "ACCELERATE_USE_FSDP" not in os.environ


@pytest.mark.parametrize("option", ["fsdp=full_shard", "deepspeed=zero2"])
def test_an_estimate_of_a_sharded_job_leaves_the_process_clean(tmp_path, option):
    import torch.distributed as dist

    res = run_job(TINY + ["mode=estimate", option], tmp_path)
    # FSDP is traced in a fake process group of its own, DeepSpeed as the nearest job it can trace, adjusted
    assert res["status"] == "ok" and res["estimate"]["method"] == ("trace" if option.startswith("fsdp")
                                                                   else "adjusted trace")
    assert not dist.is_initialized() and "WORLD_SIZE" not in os.environ


def test_the_estimate_shards_by_the_number_of_processes():
    import torch.distributed as dist

    from memsweep.estimate import capture, core

    def estimate(n, *extra):
        return core.estimate_job(*job_of(TINY + ["fsdp=full_shard", f"distributed.nproc={n}", *extra])).to_dict()

    one, two, four = (estimate(n) for n in (1, 2, 4))
    assert all(e["method"] == "trace" for e in (one, two, four))
    # rank 0 holds 1/N of the AdamW state (its shards are padded to whole rows)
    for n, est in ((2, two), (4, four)):
        assert est["optimizer_bytes"] == pytest.approx(one["optimizer_bytes"] / n, rel=0.01)
    assert one["peak_bytes"] > two["peak_bytes"] > four["peak_bytes"]
    assert not dist.is_initialized()  # the fake ranks' group is gone
    # On a GPU profile the sharded parameters are counted once (a DTensor holds no memory of its own);
    # whole 512-byte blocks add a little
    gpu = estimate(2, "hardware=a100_40gb")
    assert gpu["peak_bytes"] <= gpu["peak_allocated_bytes"] <= \
        gpu["peak_bytes"] * 1.05 + capture.CUDA_WORKSPACES_PER_STEP * capture.cublas_workspace_bytes()


def test_under_fsdp_each_accumulating_micro_batch_adds_whole_gradients_on_every_rank():
    # Accelerate's no_sync keeps FSDP2's gradients unsharded until the step's last micro-batch has added its own
    from memsweep.estimate import core

    def step_time(n):
        overrides = TINY + ["fsdp=full_shard", f"distributed.nproc={n}", "hardware=a100_40gb", "batch_size=8",
                            "accumulation=x4"]
        return core.estimate_job(*job_of(overrides)).step_time

    one, two = step_time(1), step_time(2)
    assert two.ops_accumulating == one.ops_accumulating > 0
    assert two.accumulate_s == pytest.approx(one.accumulate_s) and one.accumulate_s > 0
