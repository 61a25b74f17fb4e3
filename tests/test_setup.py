"""Building a plan: each technique reads only its own section (and the plan); nothing in the process
changes until the job builds its Trainer."""
import ast
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import TINY, compose_config
from memsweep.config import hardware
from memsweep.run.setup import build_setup

TECHNIQUES = Path(__file__).resolve().parents[1] / "src" / "memsweep" / "techniques"


def setup_of(overrides):
    job = OmegaConf.to_object(compose_config(TINY + overrides))
    return build_setup(job, hardware.detect(job.hardware))


@pytest.mark.fast
@pytest.mark.parametrize("overrides", [["deepspeed=zero2"], ["fsdp=full_shard"], ["deepspeed=zero3_offload"]])
def test_building_a_setup_has_no_side_effects(overrides):
    before = dict(os.environ)
    setup = setup_of(overrides)
    assert setup.process_group  # the job will need a process group...
    # ...and nothing made one yet. torch's inductor writes its cache folder into the environment the first
    # time a library asks for it (cache_dir_utils.cache_dir), which depends on what this process imported
    # before: a cache path, not a process group.
    assert without(os.environ, INDUCTOR_CACHE) == without(before, INDUCTOR_CACHE)


INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"


def without(env, key: str) -> dict:
    return {k: v for k, v in env.items() if k != key}


@pytest.mark.fast
def test_what_techniques_need_from_other_groups_comes_through_the_setup():
    setup = setup_of(["batch_size=32", "accumulation=x4", "lr=3e-4", "freezing=embeddings"])
    assert (setup.batch_size, setup.world_size, setup.lr) == (32, 1, 3e-4)
    assert (setup.micro_batch_size, setup.accumulation_steps) == (8, 4)
    assert setup.args["learning_rate"] == 3e-4 and setup.structure.layers == "bert.encoder.layer"


def test_no_technique_reads_the_whole_job():
    from memsweep.techniques import APPLY_ORDER

    for group, _ in APPLY_ORDER:  # the group modules (rules.py and modules.py serve them all)
        path = TECHNIQUES / f"{group}.py"
        names = {node.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Name)}
        assert "job" not in names, f"{path.name} reads the job, not its own section and the setup"
        apply = next(n for n in ast.parse(path.read_text()).body
                     if isinstance(n, ast.FunctionDef) and n.name == "apply")
        assert [a.arg for a in apply.args.args] == ["cfg", "setup"], path.name
