"""Building a plan: each technique reads only its own section (and the plan); nothing in the process
changes until the job builds its Trainer."""
import ast
import os
from pathlib import Path

import pytest
from conftest import TINY, compose_config
from omegaconf import OmegaConf

from memsweep.config import hardware
from memsweep.run.plan import build_plan

TECHNIQUES = Path(__file__).resolve().parents[1] / "src" / "memsweep" / "techniques"


def plan_of(overrides):
    job = OmegaConf.to_object(compose_config(TINY + overrides))
    return build_plan(job, hardware.detect(job.hardware))


@pytest.mark.parametrize("overrides", [["deepspeed=zero2"], ["fsdp=full_shard"], ["deepspeed=zero3_offload"]])
def test_building_a_plan_has_no_side_effects(overrides):
    before = dict(os.environ)
    plan = plan_of(overrides)
    assert plan.process_group  # the job will need a process group...
    # ...and nothing made one yet. torch's inductor writes its cache folder into the environment the first
    # time a library asks for it (cache_dir_utils.cache_dir), which depends on what this process imported
    # before: a cache path, not a process group.
    assert without(os.environ, INDUCTOR_CACHE) == without(before, INDUCTOR_CACHE)


INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"


def without(env, key: str) -> dict:
    return {k: v for k, v in env.items() if k != key}


def test_what_techniques_need_from_other_groups_comes_through_the_plan():
    plan = plan_of(["batch_size=32", "accumulation=x4", "lr=3e-4", "freezing=embeddings"])
    assert (plan.batch_size, plan.world_size, plan.lr) == (32, 1, 3e-4)
    assert (plan.micro_batch_size, plan.accumulation_steps) == (8, 4)
    assert plan.args["learning_rate"] == 3e-4 and plan.structure.layers == "bert.encoder.layer"


def test_no_technique_reads_the_whole_job():
    for path in sorted(TECHNIQUES.glob("*.py")):
        if path.name == "__init__.py":
            continue
        names = {node.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Name)}
        assert "job" not in names, f"{path.name} reads the job, not its own section and the plan"
        apply = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == "apply")
        assert [a.arg for a in apply.args.args] == ["cfg", "plan"], path.name
