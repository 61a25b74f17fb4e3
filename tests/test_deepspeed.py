"""deepspeed: every ZeRO option runs on the CPU in one process and trains like plain PyTorch."""
import pytest
from conftest import TINY, run_job, train_logging_every_step

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
    res = run_job(TINY + ["deepspeed=zero3_offload", "max_steps=2"], tmp_path / "ds")
    assert res["status"] == "ok" and res["effective"]["deepspeed_stage"] == 3
    assert res["effective"]["optimizer"] == "DeepSpeedCPUAdam"  # offloaded state is stepped on the CPU
    # the next job in the same process (as in a sweep) is an ordinary single-process job again
    import torch.distributed as dist

    assert not dist.is_initialized()
    after = run_job(TINY + ["max_steps=2"], tmp_path / "plain")
    assert after["status"] == "ok" and after["effective"]["deepspeed_stage"] is None
