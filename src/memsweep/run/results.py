"""results.json: the typed result of one job, written atomically (temp file + rename) so a killed job
never leaves half a file.

`Result` is what a job fills in as it goes (job.py, train_loop.py, launch.py); every field is present
from the start and what a job does not reach stays null. On disk it is plain JSON, read back as a dict
by the sweep layer (sweep.py) and everything after it.
"""
import dataclasses
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..errors import STATUSES

RESULTS_FILE = "results.json"
VERSIONED = ("torch", "transformers", "datasets", "peft", "accelerate", "deepspeed", "bitsandbytes",
             "hydra-core", "omegaconf", "wandb", "memsweep")

# Keys that do not change what a job measures: how the sweep is reported, whether W&B logs it, and
# what the job shows while it runs.
NOT_HASHED = ("hydra", "report", "logger", "progress")


class Section:
    def update(self, values: dict[str, Any] | None = None, **more: Any) -> None:
        """Set fields by name; a name the section does not have is a bug, not a new field."""
        for key, value in {**(values or {}), **more}.items():
            if key not in self.__dataclass_fields__:
                raise KeyError(f"{type(self).__name__} has no field {key!r}")
            setattr(self, key, value)


@dataclass
class Metrics(Section):
    f1: float | None = None
    accuracy: float | None = None
    train_loss: float | None = None
    eval_loss: float | None = None
    perplexity: float | None = None  # task=causal_lm: exp(eval_loss)
    eval_loss_before: float | None = None  # task=causal_lm: the same eval split before training
    perplexity_before: float | None = None


@dataclass
class Timing(Section):
    train_s: float | None = None
    total_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    optimizer_steps: int | None = None
    step_s_median: float | None = None  # per optimizer step, warm-up and ledger steps left out
    steps_timed: int | None = None
    setup_s: float | None = None  # job set-up to the first step
    startup_s: float | None = None  # process start to the first step
    minor_faults_per_step: int | None = None
    eval_s: float | None = None
    eval_before_s: float | None = None  # task=causal_lm: the eval split before training


@dataclass
class Memory(Section):
    peak_bytes: int | None = None
    params_bytes: int | None = None
    grads_bytes: int | None = None
    optimizer_bytes: int | None = None
    activations_bytes: int | None = None
    buffers_bytes: int | None = None
    temp_bytes: int | None = None
    other_bytes: int | None = None
    peak_breakdown: dict[str, int] | None = None  # at the peak; sums to peak_bytes
    ledger_step: int | None = None
    ledger_seq_len: int | None = None
    device: str | None = None
    cuda_max_allocated: int | None = None
    cuda_max_reserved: int | None = None
    device_used_bytes: int | None = None  # nvidia-smi's "used" (NVML) at its peak (counters.device_used_peak)
    cuda_context_bytes: int | None = None  # what "used" holds beside the caching allocator: context, libraries
    process_peak_rss: int | None = None
    per_rank: list[dict[str, Any]] | None = None  # multi-process jobs: each rank's ledger


@dataclass(frozen=True)
class RowCounts:
    """What became of the rows a job's data had (every split it read, before train_size and eval_size are drawn):
    none is left out without being counted (run/data.py, run/images.py)."""
    rows_read: int = 0
    invalid_rows_dropped: int = 0  # could not be used (no text, no label, a label that is no class): data.drop_invalid
    rows_outside_labels: int = 0  # a label data.labels does not keep: left out on purpose
    duplicate_rows_dropped: int = 0  # a text seen before: data.drop_duplicates

    def __add__(self, other: "RowCounts") -> "RowCounts":
        return RowCounts(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def summary(self) -> str | None:
        """One console line when rows were left out (None when every row read is used)."""
        parts = [f"{n:,} {what}" for n, what in (
            (self.invalid_rows_dropped, "that cannot be used dropped (data.drop_invalid=true)"),
            (self.rows_outside_labels, "left out by data.labels"),
            (self.duplicate_rows_dropped, "duplicate texts dropped (data.drop_duplicates)")) if n]
        left = self.rows_read - self.invalid_rows_dropped - self.rows_outside_labels - self.duplicate_rows_dropped
        return f"[memsweep] data: {self.rows_read:,} rows read, {', '.join(parts)}; {left:,} left" if parts else None


@dataclass
class DataFacts(Section):
    """What the job trained and evaluated on, and what became of the rows its data had (RowCounts' fields)."""
    train_examples: int | None = None
    eval_examples: int | None = None
    labels: list[str] | None = None
    train_tokens_seen: int | None = None  # non-padding: which examples were trained on, in total
    rows_read: int | None = None
    invalid_rows_dropped: int | None = None
    rows_outside_labels: int | None = None
    duplicate_rows_dropped: int | None = None


@dataclass
class Result:
    status: str = "failed"
    reason: str | None = "the job did not finish"
    overrides: list[str] = field(default_factory=list)
    config_hash: str = ""
    wandb_group: str | None = None  # the sweep's (or single run's) W&B group, see sweep.wandb_group
    metrics: Metrics = field(default_factory=Metrics)
    time: Timing = field(default_factory=Timing)
    memory: Memory = field(default_factory=Memory)
    effective: dict[str, Any] = field(default_factory=dict)  # what was observed in effect (measure.effective)
    # Where the learning rate came from (the value that ran is effective.learning_rate): a preset row's
    # stated source (tags.lr_source), an lr override, or the optimizer's own default.
    lr_source: str | None = None
    estimate: dict[str, Any] | None = None  # the estimator's prediction, made before training
    shape_advice: dict[str, Any] | None = None  # tensor-core shape flags on a GPU profile (shapes.py)
    hardware: dict[str, Any] | None = None  # the resolved hardware profile
    data: DataFacts = field(default_factory=DataFacts)
    versions: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def start(cls, overrides: list[str], cfg_hash: str, wandb_group: str | None = None) -> "Result":
        return cls(overrides=list(overrides), config_hash=cfg_hash, wandb_group=wandb_group, versions=versions())

    def end(self, status: str, reason: str | None) -> None:
        self.status, self.reason = status, reason

    def merge(self, saved: dict[str, Any], sections: tuple[str, ...]) -> None:
        """Take these sections of a result read back from disk (a rank's), field by field."""
        for name in sections:
            getattr(self, name).update(saved.get(name) or {})  # a Section or a dict: both take a dict

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def container(cfg: DictConfig) -> dict[str, Any]:
    """The job config as plain data, resolved; unresolved where an interpolation fails (bad input that
    validation refuses with its key: the job still gets a result to say so)."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    except OmegaConfBaseException:
        return OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)


def config_hash(cfg: DictConfig) -> str:
    """Hash of the resolved job config: what decides the result (resume compares it)."""
    plain = container(cfg)
    for key in NOT_HASHED:
        plain.pop(key, None)
    blob = json.dumps(plain, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def versions() -> dict[str, str | None]:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


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
    """Predicted vs measured of a real job (the sweep summary's columns): the estimate's peak and the trace's
    own (the nearest job's, for an adjusted trace), each one's error in % of memory.peak_bytes; and the
    predicted step time (at the data's typical padded length where the job predicted one) against the
    measured median step (time.step_s_median), its error in %."""
    est = res.get("estimate") or {}
    measured, step_s = (res.get("memory") or {}).get("peak_bytes"), (res.get("time") or {}).get("step_s_median")

    def err(pred, real=measured):
        return None if not pred or not real else round(100 * (pred - real) / real, 2)

    trace_peak = (est.get("trace") or {}).get("peak_bytes")
    # the step at the data's typical padded length where the job predicted one (train_loop.typical_step)
    at_data = est.get("at_data") if (est.get("at_data") or {}).get("step_s") else None
    predicted_step = at_data["step_s"] if at_data else est.get("predicted_step_s")
    return {"measured_peak_bytes": measured, "estimate_peak_bytes": est.get("peak_bytes"),
            "estimate_method": est.get("method"), "estimate_error_pct": err(est.get("peak_bytes")),
            "trace_peak_bytes": trace_peak, "trace_error_pct": err(trace_peak),
            "measured_step_s": step_s, "predicted_step_s": predicted_step,
            "predicted_step_tokens": at_data["seq_len"] if at_data else None,
            "step_time_error_pct": err(predicted_step, step_s)}
