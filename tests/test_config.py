"""Composition, typed validation, and the command line's answer to bad input."""
import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigAttributeError, ValidationError

from conftest import ROOT, compose_config


@pytest.mark.fast
def test_default_is_the_embedded_model_and_data():
    cfg = compose_config()
    assert cfg.model.source.value == "embedded" and cfg.data.source.value == "tweets"
    assert cfg.precision.name.value == "fp32" and cfg.optim.name == "adamw"
    assert cfg.lr == cfg.optim.lr  # each optimizer brings its own learning rate


@pytest.mark.fast
def test_top_level_lr_overrides_the_optimizers():
    assert compose_config(["optim=sgd"]).lr == 5e-2
    assert compose_config(["optim=sgd", "lr=0.01"]).lr == 0.01


def test_every_option_of_every_group_composes():
    for group in sorted(p for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name != "experiment"):
        for option in sorted(group.glob("*.yaml")):
            compose_config([f"{group.name}={option.stem}"])


@pytest.mark.fast
def test_unknown_key_and_wrong_type_are_refused_by_the_schema():
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(["optim.lrr=0.1"])
    assert isinstance(err.value.__cause__, ConfigAttributeError) and "lrr" in str(err.value.__cause__)
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(["batch_size=many"])
    assert isinstance(err.value.__cause__, ValidationError)
    with pytest.raises(ConfigCompositionException):
        compose_config(["freezing.name=everything"])  # enum: only the listed values


def _cli(*args):
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, says", [
    (["precision=fp8"], ["precision", "fp16", "bf16"]),  # names the group and lists what is allowed
    (["optim.lrr=1"], ["optim.lrr", "the keys here are name, hf_name, lr"]),
    (["lr=fast"], ["lr", "fast"]),
    (["freezing.name=all"], ["freezing.name", "encoder", "bottom_half"]),
    (["fsdp.strategy=zero3"], ["fsdp.strategy", "full_shard", "shard_grad_op"]),
])
def test_bad_command_line_gives_one_clear_message(args, says):
    done = _cli(*args)
    assert done.returncode != 0
    for word in says:
        assert word in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_cfg_job_answers_without_importing_the_engine():
    done = _cli("--cfg", "job")
    assert done.returncode == 0 and "batch_size: 32" in done.stdout
