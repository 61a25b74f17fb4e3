"""precision: the observed compute dtype, and what it does to measured bytes."""
import pytest

from conftest import status

SEQ = ["max_steps=2", "max_seq_len=128"]


def test_mixed_precision_really_computes_in_low_precision_and_saves_activations(tiny_job, tmp_path):
    fp32 = tiny_job(*SEQ, job_dir=tmp_path / "fp32")
    bf16 = tiny_job("precision=bf16", *SEQ, job_dir=tmp_path / "bf16")
    fp16 = tiny_job("precision=fp16", *SEQ, job_dir=tmp_path / "fp16")
    assert [r["effective"]["compute_dtype"] for r in (fp32, bf16, fp16)] == ["float32", "bfloat16", "float16"]
    # mixed precision keeps fp32 master weights
    assert bf16["effective"]["param_dtype"] == fp16["effective"]["param_dtype"] == "float32"
    for low in (bf16, fp16):
        assert low["memory"]["activations_bytes"] < 0.97 * fp32["memory"]["activations_bytes"]


def test_fp16_on_cpu_is_real_with_loss_scaling_not_silently_fp32(tiny_job):
    # Trainer/Accelerate would train fp32 here without a word; memsweep applies autocast + GradScaler.
    res = tiny_job("precision=fp16", "max_steps=2")
    assert res["effective"]["grad_scaler"] == "GradScaler" and res["effective"]["compute_dtype"] == "float16"


@pytest.mark.parametrize("precision,dtype,bytes_", [("bf16_true", "bfloat16", 2), ("fp16_true", "float16", 2),
                                                    ("fp64", "float64", 8)])
def test_true_precisions_store_weights_and_adam_state_in_their_dtype(precision, dtype, bytes_, tiny_job, tmp_path):
    fp32 = tiny_job("max_steps=2", job_dir=tmp_path / "a")
    pure = tiny_job(f"precision={precision}", "max_steps=2", job_dir=tmp_path / "b")
    assert pure["effective"]["param_dtype"] == pure["effective"]["compute_dtype"] == dtype
    assert pure["effective"]["grad_scaler"] is None  # no loss scaling: nothing to unscale fp16 gradients into
    assert pure["memory"]["params_bytes"] * 4 == fp32["memory"]["params_bytes"] * bytes_
    # AdamW's moments too (its step counts stay fp32 scalars)
    assert pure["memory"]["optimizer_bytes"] * 4 == pytest.approx(fp32["memory"]["optimizer_bytes"] * bytes_, rel=1e-4)


def test_tf32_is_refused_where_there_are_no_tf32_matmuls(tiny_job):
    assert status(tiny_job("precision=tf32", "hardware=cpu"))[0] == "unsupported"
    assert "tf32" in status(tiny_job("precision=tf32", "hardware=cpu"))[1]


def test_bf16_on_a_t4_is_refused_by_its_rule(tiny_job):
    state, reason = status(tiny_job("precision=bf16", "hardware=t4"))
    assert state == "unsupported" and reason.startswith("bf16-unsupported") and "fp16" in reason
