"""`python train.py --help` / `--cfg job` stay light: no torch or transformers import, Hydra's help unchanged.

Response time itself is measured by `make bench` (a timed test is flaky on a shared machine).
"""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

HEAVY = ("torch", "transformers", "datasets", "pandas", "wandb", "deepspeed", "peft")


def _run(*argv, code=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-X", "importtime"] + (["-c", code] if code else ["train.py"]) + list(argv)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    return proc.stdout, imported


@pytest.mark.fast
@pytest.mark.parametrize("argv", [["--help"], ["--cfg", "job"], ["precision=bf16", "--cfg", "job"]])
def test_help_and_cfg_import_no_heavy_library(argv):
    out, imported = _run(*argv)
    assert "hydra" in imported and "memsweep" in imported  # the hook sees the imports at all
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    assert ("precision" in out) if argv != ["--help"] else ("== Config groups ==" in out or "precision:" in out)


def test_help_is_the_same_with_the_shared_config_store():
    fast, _ = _run("--help")
    stock, _ = _run(code="import sys, runpy; import memsweep.config.hydra_speed as h; "
                         "h.share_config_store_in_repository_copies = lambda: None; "
                         "sys.argv = ['train.py', '--help']; runpy.run_path('train.py', run_name='__main__')")
    assert fast == stock and "optim: adafactor, adamw" in fast
