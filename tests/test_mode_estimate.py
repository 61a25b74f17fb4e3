"""mode=estimate through train.py: no training, estimate.json per job, estimate.md for the sweep."""
import itertools
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
    rows = {row["#"]: row for row in markdown_table((sweep / "estimate.md").read_text())}
    assert {job: row["precision"] for job, row in rows.items()} == {"0": "fp32", "1": "bf16"}
    for job, row in rows.items():
        res = json.loads((sweep / job / "results.json").read_text())
        assert res["status"] == "ok" and res["time"]["train_s"] is None  # nothing was trained
        assert res["estimate"]["peak_bytes"] > 0
        estimate = json.loads((sweep / job / "estimate.json").read_text())
        # the tiny model against the host's memory: fits, with the margin to show for it
        assert estimate["fits"] is True
        assert estimate["margin_bytes"] == estimate["capacity_bytes"] - estimate["total_bytes"] > 0
        assert row["fits"] == "yes", row


def markdown_table(text: str) -> list[dict[str, str]]:
    """The rows of the first markdown table in `text`, each a dict by column name."""
    lines = [line.strip() for line in text.splitlines()]
    start = next(n for n, line in enumerate(lines) if line.startswith("|"))
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    head, _rule, *body = cells
    return [dict(zip(head, row, strict=True)) for row in body]


def test_the_estimate_speaks_per_rank_whatever_the_nodes(tmp_path):
    # two ranks are two ranks, one per machine or both on one: ZeRO partitions the state over both alike
    # and each rank takes half the batch
    from conftest import run_job

    base = TINY + ["mode=estimate", "deepspeed=zero2", "batch_size=8"]
    per_rank = ("micro_batch_size", "peak_bytes", "optimizer_bytes", "grads_bytes", "activations_bytes",
                "breakdown", "flops_per_step")

    def estimate(*overrides):
        res = run_job(base + list(overrides), tmp_path / "-".join(overrides or ("alone",)))
        assert res["status"] == "ok", res["reason"]
        return {key: res["estimate"][key] for key in per_rank}

    two_nodes, one_node, alone = (estimate("distributed.nodes=2"), estimate("distributed.nproc=2"), estimate())
    assert two_nodes == one_node
    assert two_nodes["micro_batch_size"] * 2 == alone["micro_batch_size"]
    assert two_nodes["optimizer_bytes"] < alone["optimizer_bytes"]  # partitioned over the two machines' ranks
