"""results.json: one per job, written atomically (temp file + rename) so a killed job never leaves half a file."""
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

STATUSES = ("ok", "oom", "unsupported", "diverged", "failed")
RESULTS_FILE = "results.json"
VERSIONED = ("torch", "transformers", "datasets", "peft", "accelerate", "deepspeed", "bitsandbytes",
             "hydra-core", "omegaconf", "wandb", "memsweep")


# Keys that do not change what a job measures: how the sweep is reported, and whether W&B logs it.
NOT_HASHED = ("hydra", "report", "logger")


def config_hash(cfg: DictConfig) -> str:
    """Hash of the resolved job config: what decides the result (resume compares it)."""
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    for key in NOT_HASHED:
        container.pop(key, None)
    blob = json.dumps(container, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def versions() -> dict[str, str | None]:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def empty(overrides: list[str], cfg_hash: str) -> dict[str, Any]:
    """Every field present from the start; what a job does not reach stays null."""
    return {
        "status": "failed",
        "reason": "the job did not finish",
        "overrides": overrides,
        "config_hash": cfg_hash,
        "metrics": {"f1": None, "accuracy": None, "train_loss": None, "eval_loss": None},
        "time": {"train_s": None, "total_s": None, "samples_per_s": None, "tokens_per_s": None,
                 "optimizer_steps": None, "step_s_median": None, "steps_timed": None, "setup_s": None,
                 "startup_s": None, "minor_faults_per_step": None},
        "memory": {"peak_bytes": None, "params_bytes": None, "grads_bytes": None, "optimizer_bytes": None,
                   "activations_bytes": None, "buffers_bytes": None, "temp_bytes": None, "other_bytes": None,
                   "peak_breakdown": None, "ledger_step": None, "ledger_seq_len": None, "device": None,
                   "cuda_max_allocated": None, "cuda_max_reserved": None, "process_peak_rss": None},
        "effective": {},
        "estimate": None,  # the estimator's prediction, made before training (measure.estimate)
        "shape_advice": None,  # tensor-core shape flags on a GPU profile (shapes.py)
        "data": {},
        "versions": versions(),
    }


def write(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(results, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read(path: Path) -> dict[str, Any] | None:
    """A complete results file, or None (missing, or not valid JSON)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("status") in STATUSES else None


def flatten(results: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in results.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def estimate_vs_measured(res: dict[str, Any]) -> dict[str, Any]:
    """Predicted vs measured peak of a real job (the sweep summary's columns): the estimate's peak,
    the trace's and the closed form's, and each one's error in % of memory.peak_bytes."""
    est = res.get("estimate") or {}
    measured = (res.get("memory") or {}).get("peak_bytes")

    def err(pred):
        return None if not pred or not measured else round(100 * (pred - measured) / measured, 2)

    trace_peak = (est.get("trace") or {}).get("peak_bytes")
    closed_peak = (est.get("closed_form") or {}).get("peak_bytes")
    return {"measured_peak_bytes": measured, "estimate_peak_bytes": est.get("peak_bytes"),
            "estimate_method": est.get("method"), "estimate_error_pct": err(est.get("peak_bytes")),
            "trace_peak_bytes": trace_peak, "trace_error_pct": err(trace_peak),
            "closed_form_peak_bytes": closed_peak, "closed_form_error_pct": err(closed_peak)}
