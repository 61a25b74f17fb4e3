"""plan.run=K: the plan's K best fitting rows per GPU profile this machine is, each run as a short real job of
plan.run_steps optimizer steps, in one Hydra multirun through the launcher the plan job was given (so Slurm,
Ray and resume work as for any sweep); then what they measured beside the plan (planner/confirmed.py).

Each row is an option of a config group written for the run, <plan dir>/rows/plan_row/<name>.yaml (found
through hydra.searchpath): the multirun is `+plan_row=r1,r2,...` over the plan job's own overrides.
"""
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from ..config.hardware import is_this_machine
from ..config.schema import Config
from ..planner import command, confirmed
from ..planner.search import PlanRow
from ..sweep import sweepdir

ROWS_DIR, RUNS_DIR, GROUP = "rows", "runs", "plan_row"


def chosen(rows: list[PlanRow], k: int) -> list[PlanRow]:
    """The K best fitting rows of each GPU profile this machine is, in the plan's order."""
    return [r for r in rows if r.status == "fits" and r.rank is not None and r.rank <= k and is_this_machine(r.gpu)]


def row_name(row: PlanRow) -> str:
    return f"{row.gpu}_{row.rank}"


def write_group(rows: list[PlanRow], job: Config, folder: Path) -> None:
    """Each row as an option of the `plan_row` group: the row's overrides as a global package."""
    from omegaconf import OmegaConf

    group = folder / GROUP
    group.mkdir(parents=True, exist_ok=True)
    for row in rows:
        overrides = command.row_overrides(row, job, job.plan.run_steps)
        groups = [o.split("=", 1) for o in overrides if o.split("=", 1)[0] in command.GROUP_KEYS]
        values = OmegaConf.from_dotlist([o for o in overrides if o.split("=", 1)[0] not in command.GROUP_KEYS])
        (group / f"{row_name(row)}.yaml").write_text("\n".join(
            ["# @package _global_", f"# plan row {row.rank} on {row.gpu} (app/confirm.py)", "defaults:",
             *(f"  - override /{k}: {v}" for k, v in groups), OmegaConf.to_yaml(values)]))


class Inherited(NamedTuple):
    """What the row jobs inherit of the plan job's command line."""
    task: list[str]  # its overrides of the job's keys
    launcher: list[str]  # its hydra/launcher choice and hydra.launcher.* settings


def hydra_overrides() -> Inherited:
    """The plan job's overrides the row jobs inherit."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hc = HydraConfig.get()
    task = list(OmegaConf.to_container(hc.overrides.task, resolve=False))
    launcher = [o for o in OmegaConf.to_container(hc.overrides.hydra, resolve=False)
                if o.split("=", 1)[0].lstrip("+~").startswith(("hydra/launcher", "hydra.launcher"))]
    return Inherited(task, launcher)


def launch(rows: list[PlanRow], base: list[str], launcher: list[str], plan_dir: Path) -> int:
    """The rows' multirun, in a process of its own (its jobs print their lines as any sweep's); its exit code."""
    train_py = Path(__file__).resolve().parents[3] / "train.py"
    arguments = [sys.executable, str(train_py), "-m", *base, *launcher,
                 f"hydra.searchpath=[file://{plan_dir / ROWS_DIR}]", f"+{GROUP}={','.join(map(row_name, rows))}",
                 f"hydra.sweep.dir={plan_dir / RUNS_DIR}"]
    print(f"[memsweep] plan.run: {len(rows)} rows as a multirun in {plan_dir / RUNS_DIR}", flush=True)
    return subprocess.run(arguments, check=False).returncode


def measured_of(job: sweepdir.SweepJob | None) -> confirmed.Measured:
    """What a row's job measured, by the counter the plan predicts (a GPU's allocator, or the CPU ledger)."""
    if job is None:
        return confirmed.Measured("not started", "the multirun did not start it", None, None, None, "")
    on_gpu = job.get("memory.cuda_max_allocated") is not None
    return confirmed.Measured(
        status=job.status, reason=(job.reason or "")[:200], step_s=job.get("time.step_s_median"),
        memory_bytes=job.get("memory.cuda_max_allocated") if on_gpu else job.get("memory.peak_bytes"),
        reserved_bytes=job.get("memory.cuda_max_reserved"),
        counter="torch.cuda.max_memory_allocated" if on_gpu else "the ledger's peak (torch's CPU allocations)")


def run_rows(rows: list[PlanRow], job: Config, plan_dir: Path) -> list[confirmed.RunRow]:
    """Write the rows' group, run them, and read what each measured (a row whose job failed or was refused is
    recorded with its status; the others go on)."""
    inherited = hydra_overrides()
    write_group(rows, job, plan_dir / ROWS_DIR)
    launch(rows, command.base_overrides(inherited.task), inherited.launcher, plan_dir)
    jobs = sweepdir.collect(plan_dir / RUNS_DIR) if (plan_dir / RUNS_DIR).is_dir() else []
    by_row = {sweepdir.as_dict(j.overrides).get(GROUP): j for j in jobs}
    return confirmed.ranked(rows, [measured_of(by_row.get(row_name(r))) for r in rows])
