"""mode=estimate through train.py: no training, estimate.json per job, estimate.md for the sweep."""
import json
import os
import subprocess
import sys

from conftest import ROOT, TINY


def test_estimate_mode_predicts_without_training(tmp_path):
    sweep = tmp_path / "est"
    done = subprocess.run([sys.executable, "train.py", "-m", "mode=estimate", "precision=fp32,bf16", *TINY,
                           f"hydra.sweep.dir={sweep}"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "WANDB_MODE": "offline"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert (sweep / "estimate.md").is_file() and "fits" in done.stdout
    for job in ("0", "1"):
        res = json.loads((sweep / job / "results.json").read_text())
        assert res["status"] == "ok" and res["time"]["train_s"] is None  # nothing was trained
        assert res["estimate"]["peak_bytes"] > 0 and (sweep / job / "estimate.json").is_file()
