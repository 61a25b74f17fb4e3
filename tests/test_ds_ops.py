"""DeepSpeed's compiled ops are built where a job first needs them (run/ds_ops.py), never at install and never
by a job that does not run DeepSpeed's engine: the default job, mode=estimate and mode=plan load none."""
from pathlib import Path

import pytest

from conftest import THREADS, TINY, job_of, run_job
from memsweep.run import ds_ops, procenv
from memsweep.techniques import deepspeed, traits_of

PLAN = ["mode=plan", "task=causal_lm", "model=tiny-llama", "model.num_layers=2", "max_seq_len=64", "batch_size=4",
        "distributed.nproc=2", "plan.hardware=[a100_40gb]", "plan.precision=[bf16]", "plan.optim=[adamw]",
        "plan.checkpointing=[none]", "plan.lora=[none]", "plan.deepspeed=[zero3_offload]", "plan.fsdp=[none]",
        "plan.micro_batches=[2]", "plan.workers=1", "logger=none", f"threads={THREADS}"]


@pytest.fixture
def extensions_dir(monkeypatch, tmp_path) -> Path:
    """An empty torch extensions dir: where a build of this test would land."""
    root = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    return root


@pytest.fixture
def no_op_loads(monkeypatch, extensions_dir):
    """Any DeepSpeed op loaded or built (prebuilt or not), or any torch extension built, fails the test."""
    import torch.utils.cpp_extension

    procenv.prepare()  # before DeepSpeed is imported, as in a job
    from deepspeed.ops.op_builder.builder import OpBuilder

    def refuse(*args, **kwargs):
        raise AssertionError("a DeepSpeed op was loaded or built")

    for owner, name in ((OpBuilder, "load"), (OpBuilder, "jit_load"), (torch.utils.cpp_extension, "load")):
        monkeypatch.setattr(owner, name, refuse)
    return extensions_dir


@pytest.mark.slow  # three real jobs: a training, an estimate, a plan
def test_the_default_job_an_estimate_and_a_plan_load_no_deepspeed_op(no_op_loads, tmp_path):
    job = run_job(["model=tiny", "data.train_size=64", "data.eval_size=16", "logger=none", f"threads={THREADS}"],
                  tmp_path / "job")
    estimate = run_job(TINY + ["mode=estimate", "deepspeed=zero2_offload"], tmp_path / "estimate")
    plan = run_job(PLAN, tmp_path / "plan")
    assert [r["status"] for r in (job, estimate, plan)] == ["ok"] * 3, [r["reason"] for r in (job, estimate, plan)]
    assert plan["effective"]["plan"]["rows"] >= 1  # the plan searched a DeepSpeed ZeRO-Offload row
    assert not no_op_loads.exists()


def test_an_op_to_build_is_announced_in_one_line_and_a_cached_one_not(monkeypatch, extensions_dir, capsys):
    """A missing op: one line (what, about how long, where it is kept) and DeepSpeed's builder loads it; once
    its library is where torch's build leaves it, nothing is said. The build itself is the real one in
    test_deepspeed.py (a minute per op); here the builder's load writes only that library."""
    procenv.prepare()  # DeepSpeed's CPU accelerator here, as in a job, before DeepSpeed is imported
    from deepspeed.ops.op_builder.builder import OpBuilder

    loaded = []

    def build(self, verbose=False):
        loaded.append(self.name)
        (extensions_dir / self.name).mkdir(parents=True, exist_ok=True)
        (extensions_dir / self.name / f"{self.name}.so").touch()

    monkeypatch.setattr(OpBuilder, "load", build)
    monkeypatch.setattr(ds_ops, "prebuilt", lambda builder: False)
    offload = traits_of(job_of(TINY + ["deepspeed=zero2_offload"])[0])
    ds_ops.load(offload)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "DeepSpeed's deepspeed_shm_comm and cpu_adam ops" in lines[0]
    assert "first use only" in lines[0] and str(extensions_dir) in lines[0]
    assert loaded == ["deepspeed_shm_comm", "cpu_adam"]
    ds_ops.load(offload)  # cached: loaded again, silently
    assert capsys.readouterr().out == "" and loaded == ["deepspeed_shm_comm", "cpu_adam"] * 2
    ds_ops.load(traits_of(job_of(TINY)[0]))  # no DeepSpeed: nothing loaded
    assert len(loaded) == 4


def test_ops_can_be_built_only_with_a_compiler(monkeypatch, tmp_path):
    assert deepspeed.can_build_ops()  # ninja (the venv's own) and c++ are here
    monkeypatch.setenv("CXX", str(tmp_path / "no-compiler"))
    assert not deepspeed.can_build_ops()
