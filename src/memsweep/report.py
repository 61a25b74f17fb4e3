"""The sweep summary, built from the results.json files of a sweep dir (and nothing else).

Writes into the sweep dir:
  summary.csv    one row per job, every results field flattened (plus the comparison to the baseline)
  summary.md     the human table: the overrides that vary, status, peak memory and its breakdown,
                 Δ memory and speed-up against the baseline, train time, samples/s, F1
  memory.png     stacked bars per job: params / grads / optimizer / activations / other at the peak
  tradeoff.png   peak memory against train time, each point labelled with its F1

Every job of the sweep's grid gets a row: a job that did not finish is `missing`, a job that ended
otherwise than `ok` shows its status and reason. It runs at the end of every multirun (callbacks.py)
and at any time after: `python -m memsweep.report <sweep dir>` (`make report SWEEP=<sweep dir>`).
"""
import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from . import results, shapes

GIB = 2**30
# Stacks of memory.png and breakdown columns of summary.md; "other" gathers buffers and temporaries.
PARTS = ("params", "grads", "optimizer", "activations", "other")
COLORS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52",
          "other": "#8c8c8c"}
FILES = ("summary.csv", "summary.md", "memory.png", "tradeoff.png")


class ReportError(Exception):
    """Bad input: not a sweep dir, or a baseline that names no job."""


@dataclass
class Job:
    num: int
    overrides: list[str]
    status: str  # a results status, or "missing" when the job left no complete results.json
    reason: Optional[str] = None
    res: Optional[dict[str, Any]] = None
    dir: Optional[Path] = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def get(self, dotted: str) -> Any:
        value = self.res
        for key in dotted.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        return value


@dataclass
class Summary:
    sweep_dir: Path
    jobs: list[Job]
    baseline: Optional[Job]
    varying: list[str]  # override keys whose value differs between jobs
    common: list[str]  # overrides every job shares
    table: pd.DataFrame  # the human table, numbers unformatted (also the W&B table)
    markdown: str
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[Job]:
        """Jobs that make a sweep unsuccessful: errors and jobs that left no result."""
        return [j for j in self.jobs if j.status in ("failed", "missing")]


# --- collecting the jobs ------------------------------------------------------------------------

def sweep_grid(sweep_dir: Path) -> Optional[list[list[str]]]:
    """The job overrides of the sweep, in job-number order, recomputed from multirun.yaml the way
    Hydra's basic sweeper expands them. None when there is no such file or another sweeper ran."""
    path = sweep_dir / "multirun.yaml"
    if not path.is_file():
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cfg = OmegaConf.load(path)
    sweeper = OmegaConf.select(cfg, "hydra.sweeper") or {}
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    arguments = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    arguments += list(OmegaConf.select(cfg, "hydra.overrides.task") or [])
    try:
        parsed = OverridesParser.create(config_loader=_config_loader(cfg)).parse_overrides(arguments)
        batches = BasicSweeper.split_arguments(parsed, None)
    except Exception:  # e.g. a config dir that moved since; the job dirs still tell
        return None
    return [list(job) for batch in batches for job in batch]


def _config_loader(cfg):
    """A config loader on the sweep's own config dirs: `glob(*)` sweeps list a group's options."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra.core.plugins import Plugins

    Plugins.instance()  # registers the config source types (file://, pkg://, structured://)
    search_path = ConfigSearchPathImpl()
    for source in OmegaConf.select(cfg, "hydra.runtime.config_sources") or []:
        search_path.append(source.provider, f"{source.schema}://{source.path}")
    return ConfigLoaderImpl(config_search_path=search_path)


def _job_dirs(sweep_dir: Path) -> dict[int, tuple[Path, list[str]]]:
    """Job number -> (job dir, its overrides), from the .hydra/hydra.yaml Hydra writes as a job starts."""
    found = {}
    for hydra_yaml in sorted(sweep_dir.glob("*/.hydra/hydra.yaml")):
        cfg = OmegaConf.load(hydra_yaml)
        num = OmegaConf.select(cfg, "hydra.job.num")
        if num is not None:
            found[int(num)] = (hydra_yaml.parent.parent, list(OmegaConf.select(cfg, "hydra.overrides.task") or []))
    return found


def collect(sweep_dir: Path) -> list[Job]:
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ReportError(f"{sweep_dir} is not a directory")
    grid = sweep_grid(sweep_dir) or []
    found = _job_dirs(sweep_dir)
    if not grid and not found:
        raise ReportError(f"{sweep_dir} is not a sweep dir: no multirun.yaml and no job dirs with .hydra/ in it")
    jobs = []
    for num in sorted(set(range(len(grid))) | set(found)):
        job_dir, overrides = found.get(num, (None, grid[num] if num < len(grid) else []))
        res = results.read(job_dir / results.RESULTS_FILE) if job_dir else None
        if res is not None:
            jobs.append(Job(num, list(res["overrides"]), res["status"], res.get("reason"), res, job_dir))
        elif job_dir is not None:
            jobs.append(Job(num, overrides, "missing", "no complete results.json: the job was interrupted "
                                                       "(or is still running)", None, job_dir))
        else:
            jobs.append(Job(num, overrides, "missing", "the job never started"))
    return jobs


# --- the baseline -----------------------------------------------------------------------------

def _as_dict(overrides: list[str]) -> dict[str, str]:
    pairs = (o.split("=", 1) for o in overrides if "=" in o)
    return {k.lstrip("+~"): v for k, v in pairs}


def find_baseline(jobs: list[Job], spec: Optional[str]) -> Job:
    """`report.baseline`: null = the first job; a job number; or overrides the job has ("precision=fp32",
    several separated by commas or spaces; the first job having them all)."""
    if spec is None or str(spec).strip() == "":
        return jobs[0]
    spec = str(spec).strip().strip("'\"")
    if spec.isdigit():
        for job in jobs:
            if job.num == int(spec):
                return job
        raise ReportError(f"baseline {spec}: there is no job {spec}; this sweep has jobs "
                          f"{jobs[0].num}..{jobs[-1].num}")
    wanted = _as_dict(spec.replace(",", " ").split())
    if not wanted:
        raise ReportError(f"baseline {spec!r}: give a job number or overrides such as precision=fp32")
    for job in jobs:
        have = _as_dict(job.overrides)
        if all(have.get(k) == v for k, v in wanted.items()):
            return job
    raise ReportError(f"baseline {spec}: no job has these overrides; the jobs are: "
                      + "; ".join(f"{j.num}: {' '.join(j.overrides) or 'default'}" for j in jobs))


# --- the tables -------------------------------------------------------------------------------

def _varying(jobs: list[Job]) -> tuple[list[str], list[str]]:
    """Override keys whose value differs between jobs (in first-seen order), and the shared overrides."""
    dicts = [_as_dict(j.overrides) for j in jobs]
    keys = list(dict.fromkeys(k for d in dicts for k in d))
    varying = [k for k in keys if len({d.get(k) for d in dicts}) > 1]
    common = [f"{k}={dicts[0][k]}" for k in keys if k not in varying]
    return varying, common


def _parts_gib(job: Job) -> dict[str, Optional[float]]:
    """The peak's breakdown in GiB: what was alive at the peak, summing to the peak."""
    breakdown = job.get("memory.peak_breakdown") if job.ok else None
    if not breakdown:
        return {p: None for p in PARTS}
    other = sum(breakdown.get(k, 0) or 0 for k in ("buffers", "temp", "other"))
    return {p: (other if p == "other" else breakdown.get(p, 0) or 0) / GIB for p in PARTS}


def human_table(jobs: list[Job], baseline: Job, varying: list[str]) -> pd.DataFrame:
    base_peak = baseline.get("memory.peak_bytes") if baseline.ok else None
    base_train = baseline.get("time.train_s") if baseline.ok else None
    rows = []
    for job in jobs:
        overrides = _as_dict(job.overrides)
        row: dict[str, Any] = {"job": job.num}
        if varying:
            row.update({k: overrides.get(k, "") for k in varying})
        else:
            row["overrides"] = " ".join(job.overrides) or "default"
        peak = job.get("memory.peak_bytes") if job.ok else None
        train_s = job.get("time.train_s") if job.ok else None
        row.update(status=job.status, peak_gib=peak / GIB if peak else None)
        row.update({f"{p}_gib": v for p, v in _parts_gib(job).items()})
        predicted = results.estimate_vs_measured(job.res) if job.ok else {}
        predicted_peak = predicted.get("estimate_peak_bytes")
        row.update(predicted_gib=predicted_peak / GIB if predicted_peak else None,
                   predicted_error_pct=predicted.get("estimate_error_pct"))
        row["delta_memory_pct"] = 100 * (peak - base_peak) / base_peak if peak and base_peak else None
        row["speedup"] = base_train / train_s if train_s and base_train else None
        row.update(train_s=train_s, samples_per_s=job.get("time.samples_per_s") if job.ok else None,
                   f1=job.get("metrics.f1") if job.ok else None, reason=job.reason)
        advice = job.get("shape_advice") if job.res else None
        row["tensor_core_shapes"] = shapes.cell(advice) if advice else None
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def _counts(jobs: list[Job]) -> str:
    statuses = [j.status for j in jobs]
    return ", ".join(f"{statuses.count(s)} {s}" for s in (*results.STATUSES, "missing") if s in statuses)


def markdown(summary_table: pd.DataFrame, jobs: list[Job], baseline: Job, varying: list[str],
             common: list[str], notes: list[str]) -> str:
    t = summary_table
    shown = pd.DataFrame({"#": t["job"]})
    for key in varying or ["overrides"]:
        shown[key] = t[key]
    shown["status"] = t["status"]
    shown["peak GiB"] = [_fmt(v, ".3f") for v in t["peak_gib"]]
    for part in PARTS:
        shown[part] = [_fmt(v, ".3f") for v in t[f"{part}_gib"]]
    shown["predicted GiB"] = [_fmt(v, ".3f") for v in t["predicted_gib"]]
    shown["error"] = [_fmt(v, "+.1f", " %") for v in t["predicted_error_pct"]]
    shown["Δ memory"] = ["baseline" if n == baseline.num and baseline.ok else _fmt(v, "+.1f", " %")
                         for n, v in zip(t["job"], t["delta_memory_pct"])]
    shown["speed-up"] = [_fmt(v, ".2f", "×") for v in t["speedup"]]
    shown["train s"] = [_fmt(v, ".1f") for v in t["train_s"]]
    shown["samples/s"] = [_fmt(v, ".1f") for v in t["samples_per_s"]]
    shown["F1"] = [_fmt(v, ".3f") for v in t["f1"]]
    advices = [j.get("shape_advice") if j.res else None for j in jobs]
    if any(advices):  # a GPU profile with a tensor-core rule
        shown["not a tensor-core multiple"] = [v or "–" for v in t["tensor_core_shapes"]]

    lines = [f"# Sweep summary: {len(jobs)} jobs ({_counts(jobs)})", ""]
    if common:
        lines += [f"Common to every job: `{' '.join(common)}`", ""]
    lines += [f"Baseline: job {baseline.num} (`{' '.join(baseline.overrides) or 'default'}`). "
              "Peak memory and its breakdown (GiB) are the measured ledger at the peak step; "
              "other = buffers + temporaries. Predicted = the estimator's peak, made before the job ran "
              "(error vs the measured peak). Δ memory and speed-up (train time) are against the baseline.", ""]
    lines += [shown.to_markdown(index=False, disable_numparse=True), ""]
    not_ok = [j for j in jobs if not j.ok]
    if not_ok:
        lines += ["Jobs that did not end `ok`:", ""]
        lines += [f"- job {j.num} (`{' '.join(j.overrides) or 'default'}`): **{j.status}** — {j.reason}"
                  for j in not_ok]
        lines.append("")
    lines += [f"- {n}" for n in notes + shapes.table_notes(advices)]
    return "\n".join(lines).rstrip() + "\n"


def flat_table(jobs: list[Job], human: pd.DataFrame) -> pd.DataFrame:
    """summary.csv: every results field, flattened with dots; lists as JSON, overrides space-separated."""
    rows = []
    for job in jobs:
        flat = results.flatten(job.res) if job.res else {"status": job.status, "reason": job.reason}
        flat["overrides"] = " ".join(job.overrides)
        row = {"job": job.num, "job_dir": str(job.dir) if job.dir else None}
        row.update({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in flat.items()})
        rows.append(row)
    flat_df = pd.DataFrame(rows)
    comparison = human[["job", "delta_memory_pct", "speedup"]].rename(
        columns={"delta_memory_pct": "baseline.delta_memory_pct", "speedup": "baseline.speedup"})
    return flat_df.merge(comparison, on="job", how="left")


# --- the plots --------------------------------------------------------------------------------

def _label(job: Job, varying: list[str]) -> str:
    overrides = _as_dict(job.overrides)
    shown = [f"{k}={overrides[k]}" for k in varying if k in overrides] or job.overrides
    return f"#{job.num} " + (" ".join(shown) or "default")


def plot_memory(jobs: list[Job], varying: list[str], path: Path) -> None:
    """Horizontal stacked bars, one per job in job order (horizontal: long labels and many jobs fit)."""
    fig = Figure(figsize=(10, 1.5 + 0.45 * len(jobs)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ys = list(range(len(jobs)))[::-1]  # first job on top
    left = [0.0] * len(jobs)
    for part in PARTS:
        widths = [_parts_gib(j)[part] or 0.0 for j in jobs]
        ax.barh(ys, widths, left=left, color=COLORS[part], label=part, height=0.7)
        left = [a + b for a, b in zip(left, widths)]
    for y, job, total in zip(ys, jobs, left):
        text = f"{total:.3f} GiB" if job.ok and total else job.status
        ax.text(total, y, f"  {text}", va="center", fontsize=8,
                color="black" if job.ok else "#b22222", fontweight="normal" if job.ok else "bold")
    ax.set_yticks(ys, [_label(j, varying) for j in jobs], fontsize=8)
    ax.set_xlim(0, max(left + [1e-3]) * 1.25)
    ax.set_xlabel("memory at the peak step (GiB)")
    ax.set_title("Peak memory per job, by what holds it")
    fig.legend(loc="outside lower center", fontsize=8, ncols=len(PARTS))
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(path, dpi=120)


def plot_tradeoff(jobs: list[Job], baseline: Job, varying: list[str], path: Path) -> None:
    fig = Figure(figsize=(8, 6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ok = [j for j in jobs if j.ok and j.get("memory.peak_bytes") and j.get("time.train_s")]
    for job in ok:
        x, y = job.get("time.train_s"), job.get("memory.peak_bytes") / GIB
        is_base = job is baseline
        ax.scatter([x], [y], s=70, marker="*" if is_base else "o", color="#c44e52" if is_base else "#4c72b0",
                   zorder=3)
        f1 = job.get("metrics.f1")
        ax.annotate(f"F1 {f1:.3f}" if f1 is not None else "F1 –", (x, y), xytext=(6, 5),
                    textcoords="offset points", fontsize=9, fontweight="bold")
        ax.annotate(_label(job, varying), (x, y), xytext=(6, -9), textcoords="offset points", fontsize=7,
                    color="#555555")
    left_out = [f"#{j.num} {j.status}" for j in jobs if j not in ok]
    if left_out:
        ax.text(0.01, 0.01, "not plotted: " + ", ".join(left_out), transform=ax.transAxes, fontsize=8,
                color="#b22222", va="bottom")
    ax.set_xlabel("train time (s)")
    ax.set_ylabel("peak memory (GiB)")
    ax.set_title("Memory against time (★ baseline); labels: macro-F1")
    # from zero, so distances read as proportions; headroom for the labels
    ax.set_xlim(0, max([j.get("time.train_s") for j in ok], default=1) * 1.4)
    ax.set_ylim(0, max([j.get("memory.peak_bytes") / GIB for j in ok], default=1) * 1.2)
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120)


# --- all of it ----------------------------------------------------------------------------------

def build(sweep_dir: Path, baseline: Optional[str] = None, strict: bool = True) -> Summary:
    """Read the sweep. A baseline that names no job raises ReportError, or, with strict=False (the end
    of a sweep, which must still get its summary), falls back to the first job with a note."""
    sweep_dir = Path(sweep_dir)
    jobs = collect(sweep_dir)
    notes = []
    try:
        base = find_baseline(jobs, baseline)
    except ReportError as exc:
        if strict:
            raise
        base = jobs[0]
        notes.append(f"{exc} — using job {base.num} instead")
    if not base.ok:
        notes.append(f"the baseline (job {base.num}) is {base.status}: no Δ memory or speed-up; "
                     f"choose another with report.baseline=<job number or overrides>")
    varying, common = _varying(jobs)
    table = human_table(jobs, base, varying)
    return Summary(sweep_dir, jobs, base, varying, common, table,
                   markdown(table, jobs, base, varying, common, notes), notes)


def write(summary: Summary) -> dict[str, Path]:
    out = {name: summary.sweep_dir / name for name in FILES}
    flat_table(summary.jobs, summary.table).to_csv(out["summary.csv"], index=False)
    out["summary.md"].write_text(summary.markdown)
    plot_memory(summary.jobs, summary.varying, out["memory.png"])
    plot_tradeoff(summary.jobs, summary.baseline, summary.varying, out["tradeoff.png"])
    return out


def wandb_group(sweep_dir: str) -> str:
    """The W&B group of a sweep's runs: its dir as given, "/" -> "_" (as job.hydra_context names it)."""
    return str(sweep_dir).strip("/").replace("/", "_")


def log_to_wandb(summary: Summary, logger_cfg, group: str) -> Optional[Path]:
    """One job_type=summary run in the sweep's group: the table and both plots. Returns its run dir."""
    if not logger_cfg.enabled:
        return None
    import wandb

    from . import wandb_log

    run = wandb_log.start(logger_cfg, summary.sweep_dir, group=group, name="summary", job_type="summary",
                          config={"sweep_dir": str(summary.sweep_dir), "baseline_job": summary.baseline.num,
                                  "jobs": len(summary.jobs)},
                          tags=["summary"])
    if run is None:
        return None
    table = summary.table.astype(object).where(summary.table.notna(), None)  # NaN -> null in the table
    # Images from the PNG files: a raw matplotlib figure would need plotly, which is not installed.
    run.log({"summary": wandb.Table(dataframe=table),
             "memory": wandb.Image(str(summary.sweep_dir / "memory.png")),
             "tradeoff": wandb.Image(str(summary.sweep_dir / "tradeoff.png"))})
    counts = {s: sum(j.status == s for j in summary.jobs) for s in {j.status for j in summary.jobs}}
    run_dir = Path(run.dir).parent  # run.dir is its files/ folder
    wandb_log.finish(run, {f"jobs.{k}": v for k, v in counts.items()})
    return run_dir


def latest_sweep(root: Path = Path("multirun")) -> Optional[Path]:
    dirs = sorted(p.parent for p in root.glob("*/*/multirun.yaml"))
    return dirs[-1] if dirs else None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memsweep.report", description=__doc__.split("\n")[0])
    parser.add_argument("sweep_dir", nargs="?", default="", help="the sweep's directory, e.g. multirun/<date>/<time>")
    parser.add_argument("--baseline", default=None,
                        help="job number or overrides (default: the sweep's report.baseline, else the first job)")
    parser.add_argument("--wandb", action="store_true",
                        help="also log a job_type=summary W&B run in the sweep's group (e.g. for an interrupted sweep)")
    args = parser.parse_args(argv)
    if not args.sweep_dir:
        hint = latest_sweep()
        print("memsweep report: error: no sweep dir given; usage: make report SWEEP=multirun/<date>/<time>"
              + (f" (latest: {hint})" if hint else ""), file=sys.stderr)
        return 2
    sweep_dir = Path(args.sweep_dir)
    baseline = args.baseline
    if baseline is None and (sweep_dir / "multirun.yaml").is_file():
        baseline = OmegaConf.select(OmegaConf.load(sweep_dir / "multirun.yaml"), "report.baseline")
    try:
        summary = build(sweep_dir, baseline)
    except ReportError as exc:
        print(f"memsweep report: error: {exc}", file=sys.stderr)
        return 2
    paths = write(summary)
    print(summary.markdown)
    print("written: " + ", ".join(str(p) for p in paths.values()))
    if args.wandb:
        from .resume import sweep_dir_as_launched
        from .schema import LoggerConf

        # the sweep's own project/entity/tags; asked for explicitly, so logged even if the sweep had logger=none
        saved = OmegaConf.select(OmegaConf.load(sweep_dir / "multirun.yaml"), "logger") \
            if (sweep_dir / "multirun.yaml").is_file() else None
        logger_cfg = OmegaConf.merge(OmegaConf.structured(LoggerConf), saved or {}, {"enabled": True})
        group = wandb_group(sweep_dir_as_launched(sweep_dir))
        print(f"W&B summary run (group {group}): {log_to_wandb(summary, logger_cfg, group)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
