"""mode=plan: search the space, rank the rows, write and print the tables; with plan.run=K, run the K best
rows of this machine's profiles and write what they measured beside the plan (app/confirm.py)."""
import time
from pathlib import Path

from ..config.schema import Config
from ..planner import command, confirmed, search, space, table
from ..planner.search import PlanRow
from ..run import task
from . import confirm


def run_plan(job: Config, job_dir: Path) -> dict:
    """Search, rank, write plan.csv / plan.md into job_dir and print the top rows per GPU (the plan's keys
    were checked with the job's, app/job.py); then run the rows plan.run asks for."""
    started, job_dir = time.perf_counter(), Path(job_dir)
    rows = table.ranked(search.search(job, progress=lambda line: print(f"[memsweep] plan {line}", flush=True)))
    batch = (f"batch {job.batch_size} images" if task.images(job.task)  # max_seq_len does not apply to images
             else f"batch {job.batch_size} x {job.max_seq_len} tokens")
    title = (f"Plan: {job.model.name}, {job.task.name.value}, {batch} per optimizer step, "
             f"on {', '.join(space.profiles(job))}")
    base = command.base_overrides(confirm.hydra_overrides().task)
    written = table.Written({(r.gpu, r.rank): command.command(r, job, base) for r in rows if r.rank is not None})
    print(table.write(rows, job_dir, job.plan.top, title, written), flush=True)
    seconds = round(time.perf_counter() - started, 1)
    print(f"[memsweep] plan: {len(rows)} rows in {seconds} s; {job_dir / 'plan.md'}", flush=True)
    best = {gpu: next((r for r in rows if r.gpu == gpu and r.rank == 1), None) for gpu in space.profiles(job)}
    out = {"seconds": seconds, "rows": len(rows), "fastest": {g: fastest(r) for g, r in best.items()}}
    if job.plan.run:
        out["run"] = run_rows(rows, job, job_dir, title, written)
    return out


def run_rows(rows: list[PlanRow], job: Config, job_dir: Path, title: str, written: table.Written) -> dict:
    """Run the chosen rows, rewrite plan.csv / plan.md with what they measured, and print how they agree."""
    runs = confirm.run_rows(confirm.chosen(rows, job.plan.run), job, job_dir)
    plot = confirmed.plot(runs, job_dir / "plan_run.png")
    table.write(rows, job_dir, job.plan.top, title, table.Written(written.commands, runs, plot))
    agreements = [confirmed.agreement(runs, gpu) for gpu in dict.fromkeys(r.row.gpu for r in runs)]
    for a in agreements:
        print(f"[memsweep] plan.run {confirmed.said(a)}", flush=True)
    return {"rows": len(runs), "ok": sum(r.measured.status == "ok" for r in runs),
            "agreement": [vars(a) for a in agreements]}


def fastest(row: PlanRow | None) -> dict | None:
    """A GPU's top row as results.json records it: the combination's options, its micro-batch and step time."""
    if row is None:
        return None
    return {**row.combination.options(), "micro_batch": row.micro_batch, "step_s": row.figures.step_s}
