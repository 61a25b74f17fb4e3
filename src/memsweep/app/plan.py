"""mode=plan: search the space, rank the rows, write and print the tables."""
import time
from pathlib import Path

from ..config.schema import Config
from ..planner import search, table
from ..planner.search import PlanRow
from ..run import task


def run_plan(job: Config, job_dir: Path) -> dict:
    """Search, rank, write plan.csv / plan.md into job_dir and print the top rows per GPU (the plan's keys
    were checked with the job's, app/job.py)."""
    started = time.perf_counter()
    rows = table.ranked(search.search(job, progress=lambda line: print(f"[memsweep] plan {line}", flush=True)))
    batch = (f"batch {job.batch_size} images" if task.images(job.task)  # max_seq_len does not apply to images
             else f"batch {job.batch_size} x {job.max_seq_len} tokens")
    title = (f"Plan: {job.model.name}, {job.task.name.value}, {batch} per optimizer step, "
             f"on {', '.join(job.plan.hardware)}")
    print(table.write(rows, Path(job_dir), job.plan.top, title), flush=True)
    seconds = round(time.perf_counter() - started, 1)
    print(f"[memsweep] plan: {len(rows)} rows in {seconds} s; {Path(job_dir) / 'plan.md'}", flush=True)
    best = {gpu: next((r for r in rows if r.gpu == gpu and r.rank == 1), None) for gpu in job.plan.hardware}
    return {"seconds": seconds, "rows": len(rows), "fastest": {g: fastest(r) for g, r in best.items()}}


def fastest(row: PlanRow | None) -> dict | None:
    """A GPU's top row as results.json records it: the combination's options, its micro-batch and step time."""
    if row is None:
        return None
    return {**row.combination.options(), "micro_batch": row.micro_batch, "step_s": row.figures.step_s}
