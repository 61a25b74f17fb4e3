"""The one sweep layer: what a sweep dir holds and how its jobs are named.

A sweep dir is what `train.py -m` (or `python -m memsweep.app.estimate`) writes: numbered job dirs, each
with results.json (and estimate.json for estimates), plus multirun.yaml for Hydra sweeps. Here:
the grid a sweep's overrides expand to (Hydra's own basic sweeper), the jobs found on disk, the
overrides that vary between them, and the W&B group the jobs log to. The summary (report.py), the
estimate table (estimate/table.py), resume and W&B all read sweeps through this module.
"""
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ..estimate import ESTIMATE_FILE
from ..run import results

MULTIRUN_FILE = "multirun.yaml"
STATUS_FILE = "status.json"  # the estimate CLI's record of a job it could not estimate
OVERRIDES_FILE = "overrides.json"  # the estimate CLI's record of a job's overrides


class SweepError(Exception):
    """Not a sweep dir, or a job spec that names no job."""


def wandb_group(root: str) -> str:
    """The W&B group of a sweep's (or a single run's) jobs: its dir as given, "/" -> "_". Each job
    stores it in results.json (`wandb_group`), so nothing needs to spell it again."""
    return str(root).strip("/").replace("/", "_")


def multirun_value(sweep_dir: Path, key: str) -> Any:
    """A key of the sweep's multirun.yaml (None when there is no such file or key)."""
    path = Path(sweep_dir) / MULTIRUN_FILE
    return OmegaConf.select(OmegaConf.load(path), key) if path.is_file() else None


def launched_dir(sweep_dir: Path) -> str:
    """The sweep dir spelled as its jobs saw it: the `hydra.sweep.dir=` override it was launched with,
    else (the default multirun/<date>/<time>) its path relative to the current dir."""
    sweep_dir = Path(sweep_dir)
    given = [o.split("=", 1)[1] for o in multirun_value(sweep_dir, "hydra.overrides.hydra") or []
             if o.startswith("hydra.sweep.dir=")]
    if given and Path(given[-1]).exists() and Path(given[-1]).samefile(sweep_dir):
        return given[-1]
    try:
        return str(sweep_dir.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(sweep_dir)


def expand(arguments: list[str], config_loader=None) -> list[list[str]]:
    """The jobs of a sweep from its overrides, by Hydra's own basic sweeper (`a=1,2 b=x,y`: 4 jobs).
    A config loader lets `glob(*)` list a group's options."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(arguments)
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def grid(sweep_dir: Path) -> list[list[str]] | None:
    """The job overrides of a Hydra sweep, in job-number order, recomputed from multirun.yaml. None
    when there is no such file or another sweeper ran."""
    path = Path(sweep_dir) / MULTIRUN_FILE
    return grid_of(OmegaConf.load(path)) if path.is_file() else None


def size(cfg) -> int | None:
    """How many jobs a multirun config runs: its grid's, or the trials of a search (hparams_search);
    None when the sweeper does not say."""
    planned = grid_of(cfg)
    if planned is not None:
        return len(planned)
    trials = OmegaConf.select(cfg, "hydra.sweeper.n_trials")
    return int(trials) if isinstance(trials, int) and trials > 0 else None


def grid_of(cfg) -> list[list[str]] | None:
    """The job overrides of a multirun config (what multirun.yaml holds); None for another sweeper."""
    sweeper = OmegaConf.select(cfg, "hydra.sweeper") or {}
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    arguments = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    arguments += list(OmegaConf.select(cfg, "hydra.overrides.task") or [])
    try:
        return expand(arguments, _config_loader(cfg))
    except Exception:  # e.g. a config dir that moved since; the job dirs still tell
        return None


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


def job_dirs(sweep_dir: Path) -> dict[int, tuple[Path, list[str]]]:
    """Job number -> (job dir, its overrides): from the .hydra/hydra.yaml Hydra writes as a job starts,
    or the overrides.json of the estimate CLI."""
    found = {}
    for hydra_yaml in sorted(Path(sweep_dir).glob("*/.hydra/hydra.yaml")):
        cfg = OmegaConf.load(hydra_yaml)
        num = OmegaConf.select(cfg, "hydra.job.num")
        if num is not None:
            found[int(num)] = (hydra_yaml.parent.parent, list(OmegaConf.select(cfg, "hydra.overrides.task") or []))
    for note in sorted(Path(sweep_dir).glob(f"*/{OVERRIDES_FILE}")):
        if note.parent.name.isdigit() and int(note.parent.name) not in found:
            found[int(note.parent.name)] = (note.parent, json.loads(note.read_text()))
    return found


@dataclass
class SweepJob:
    num: int
    overrides: list[str]
    status: str  # a results status; "not started" when it has no dir; "missing" when it began but left no result
    reason: str | None = None
    res: dict[str, Any] | None = None  # its results.json
    dir: Path | None = None
    estimate: dict[str, Any] | None = None  # estimate.json, else the estimate stored in results.json

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def get(self, dotted: str) -> Any:
        value = self.res
        for key in dotted.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        return value


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def collect(sweep_dir: Path) -> list[SweepJob]:
    """Every job of the sweep: the grid's and the ones on disk, in job-number order."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise SweepError(f"{sweep_dir} is not a directory")
    planned = grid(sweep_dir) or []
    found = job_dirs(sweep_dir)
    if not planned and not found:
        raise SweepError(f"{sweep_dir} is not a sweep dir: no {MULTIRUN_FILE} and no job dirs in it")
    jobs = []
    for num in sorted(set(range(len(planned))) | set(found)):
        job_dir, overrides = found.get(num, (None, planned[num] if num < len(planned) else []))
        if job_dir is None:
            jobs.append(SweepJob(num, overrides, "not started", "the job never started"))
            continue
        res = results.read(job_dir / results.RESULTS_FILE)
        estimate = _read_json(job_dir / ESTIMATE_FILE) or (res or {}).get("estimate")
        # no results.json: the estimate CLI's outcome (its status.json, or an estimate made)
        recorded = res or _read_json(job_dir / STATUS_FILE) or ({"status": "ok"} if estimate else None)
        if recorded is None:
            jobs.append(SweepJob(num, overrides, "missing", "no complete results.json: the job was interrupted "
                                                            "(or is still running)", None, job_dir, estimate))
        else:
            jobs.append(SweepJob(num, list((res or {}).get("overrides") or overrides), recorded["status"],
                                 recorded.get("reason"), res, job_dir, estimate))
    return jobs


def job_name(overrides: list[str]) -> str:
    """A job as memsweep's lines, W&B and the summary name it: its overrides, or `default`."""
    return ",".join(overrides) or "default"


def as_dict(overrides: list[str]) -> dict[str, str]:
    pairs = (o.split("=", 1) for o in overrides if "=" in o)
    return {k.lstrip("+~"): v for k, v in pairs}


def varying(jobs: list[SweepJob]) -> tuple[list[str], list[str]]:
    """Override keys whose value differs between jobs (in first-seen order), and the shared overrides."""
    dicts = [as_dict(j.overrides) for j in jobs]
    keys = list(dict.fromkeys(k for d in dicts for k in d))
    differ = [k for k in keys if len({d.get(k) for d in dicts}) > 1]
    common = [f"{k}={dicts[0][k]}" for k in keys if k not in differ]
    return differ, common


def group_of(sweep_dir: Path, jobs: list[SweepJob]) -> str:
    """The W&B group the sweep's jobs logged to: stored in their results.json."""
    stored = [j.res.get("wandb_group") for j in jobs if j.res and j.res.get("wandb_group")]
    return stored[0] if stored else wandb_group(launched_dir(sweep_dir))
