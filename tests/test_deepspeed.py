"""deepspeed: every ZeRO option runs on the CPU in one process and trains like plain PyTorch, and its
estimate (the nearest traceable job with ZeRO's per-process buffers, estimate/adjust.py) predicts the
measured peak."""
import pytest

from conftest import TINY, run_job, train_logging_every_step

# One worker runs the whole module (`make test`: --dist loadgroup), so its module fixture's jobs run once.
pytestmark = pytest.mark.xdist_group("deepspeed")

EXACT = TINY + ["model.dropout=0", "max_steps=4", "measure.ledger=false"]


def _losses(overrides, job_dir):
    from memsweep.run.train_loop import release

    losses, built = train_logging_every_step(EXACT + overrides, job_dir)
    release(built)
    return losses, built.trainer


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _losses([], tmp_path_factory.mktemp("plain"))[0]


@pytest.mark.parametrize("option, stage", [("zero0", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3),
                                           ("zero2_offload", 2), ("zero3_offload", 3)])
def test_zero_stages_match_plain_training(tmp_path, reference, option, stage):
    losses, trainer = _losses([f"deepspeed={option}"], tmp_path)
    assert trainer.model_wrapped.zero_optimization_stage() == stage
    assert len(losses) == len(reference) == 4
    assert losses == pytest.approx(reference, abs=1e-3)


def test_deepspeed_job_records_its_stage_and_leaves_the_process_clean(tmp_path):
    import torch.distributed as dist
    import torch.nn.functional as F

    linear = F.linear
    res = run_job(TINY + ["deepspeed=zero3_offload", "max_steps=2"], tmp_path / "ds")
    assert res["status"] == "ok" and res["effective"]["deepspeed_stage"] == 3
    assert res["effective"]["optimizer"] == "DeepSpeedCPUAdam"  # offloaded state is stepped on the CPU
    # the next job in the same process (as in a sweep) is an ordinary single-process job again, with torch's
    # own linear (zero.Init replaces it, for good unless reset)
    assert not dist.is_initialized() and F.linear is linear
    after = run_job(TINY + ["max_steps=2"], tmp_path / "plain")
    assert after["status"] == "ok" and after["effective"]["deepspeed_stage"] is None


# Long enough sequences that activations and ZeRO's buffers both weigh; bf16 and accumulation move the peak
SIZED = TINY + ["max_steps=3", "batch_size=16", "max_seq_len=128", "data.train_size=64", "data.eval_size=16"]


@pytest.mark.slow  # real DeepSpeed jobs (bf16 is emulated on this CPU)
@pytest.mark.parametrize("overrides", [["deepspeed=zero1"], ["deepspeed=zero2", "precision=bf16"],
                                       ["deepspeed=zero3", "precision=bf16", "optim=adamw_torch"],
                                       ["deepspeed=zero2", "optim=adamw_torch", "accumulation=x4"]],
                         ids=lambda o: "-".join(v.split("=")[1] for v in o))
def test_the_adjusted_trace_predicts_the_measured_peak(overrides, tmp_path):
    res = run_job(SIZED + overrides, tmp_path / "job")
    assert res["status"] == "ok", res["reason"]
    est, measured = res["estimate"], res["memory"]
    assert est["method"] == "adjusted trace" and "DeepSpeed" in est["method_reason"]
    assert est["peak_bytes"] == pytest.approx(measured["peak_bytes"], rel=0.01)
    # the ledger counts DeepSpeed's own fp32 copy of the weights (its optimizer's, not the model's)
    assert measured["peak_breakdown"]["other"] >= 4 * res["effective"]["trainable_params"]


def test_the_bucket_keys_reach_deepspeeds_config():
    from memsweep.app.estimate import compose
    from memsweep.techniques.deepspeed import ds_config

    def zero(*overrides):
        return ds_config(compose(TINY + list(overrides)).deepspeed)["zero_optimization"]

    assert zero("deepspeed=zero2")["reduce_bucket_size"] == "auto" and zero("deepspeed=zero2")["overlap_comm"] is False
    assert zero("deepspeed=zero3")["overlap_comm"] is True  # DeepSpeed's own default for stage 3, kept
    lightning = zero("deepspeed=zero2", "deepspeed.reduce_bucket_size=200000000", "deepspeed.overlap_comm=true")
    assert (lightning["reduce_bucket_size"], lightning["overlap_comm"]) == (200_000_000, True)


@pytest.mark.parametrize("stage", [2, 3])
def test_on_a_gpu_zero_offload_keeps_the_optimizers_state_and_step_on_the_host(stage):
    # CPUAdam steps the partition on the host: on the GPU neither its state nor its step's temporaries
    from conftest import job_of
    from memsweep.estimate.core import estimate_job

    est = {o: estimate_job(*job_of(TINY + ["hardware=a100_40gb", "batch_size=4", "precision=bf16",
                                           f"deepspeed=zero{stage}{o}"])).to_dict() for o in ("", "_offload")}
    kept, offloaded = est[""], est["_offload"]
    assert kept["breakdown"]["optimizer"] > 0
    assert offloaded["breakdown"].get("optimizer", 0) == offloaded["breakdown"].get("temp", 0) == 0
    assert kept["peak_allocated_bytes"] - offloaded["peak_allocated_bytes"] >= kept["breakdown"]["optimizer"]
