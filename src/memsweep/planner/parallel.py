"""A plan's units searched in worker processes, one per CPU this process may use (or plan.workers).

Each unit is a few combinations that share what a trace leaves behind (space.units): a worker keeps its own
memo across the units it is given, so nothing crosses between processes but a unit in and its rows out.
Workers are spawned (a fresh interpreter: no OpenMP or torch state copied from this process) and leave a
stop to this process: a signal stops the plan here, and leaving the pool ends the workers at once.
"""
import multiprocessing
import os
import signal
from collections.abc import Callable
from pathlib import Path

from ..run import console

# a worker's traces and floors, kept across the units it is given
_memo: dict = {}
# why a worker could not start: a pool replaces a worker whose initializer raises with another, forever, so the
# error waits here and ends the first unit the worker is given (the plan fails, it does not hang)
_broken: list[BaseException] = []


def workers(wanted: int, units: int) -> int:
    """How many processes: `wanted`, or with 0 every CPU this process may use; never more than units."""
    return max(1, min(wanted or cpus(), units))


def cpus() -> int:
    """The CPUs this process may use (its affinity, where the OS has one: Linux; else every CPU)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def _start(log: Path | None) -> None:
    try:
        console.worker_output_to(log)  # its rows and lines come back to the plan's process, which prints them
        # the terminal's Ctrl-C reaches every process of its group: the plan's own process handles it
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        import torch

        torch.set_num_threads(1)  # one process per CPU: a worker's ops on one thread
    except Exception as exc:  # noqa: BLE001 - kept for _run to raise: see _broken
        _broken.append(exc)


def _run(task: tuple) -> tuple[int, list, list[str]]:
    """A unit searched in this worker: its index, its rows (search.PlanRow) and its progress lines."""
    if _broken:
        raise RuntimeError(f"a plan worker could not start: {type(_broken[0]).__name__}: {_broken[0]}")
    index, search_unit, job, unit = task
    lines: list[str] = []
    return index, search_unit(job, unit, _memo, lines.append), lines


def map_units(search_unit: Callable, job, units: list, processes: int, progress: Callable[[str], None]) -> list:
    """[search_unit(job, unit, memo, progress) for each unit], run in `processes` workers; each unit's progress
    lines are printed as it finishes."""
    out: list = [None] * len(units)
    log = console.root_log_file()  # the job log: what the libraries print in a worker goes there
    with multiprocessing.get_context("spawn").Pool(processes, initializer=_start, initargs=(log,)) as pool:
        tasks = [(i, search_unit, job, unit) for i, unit in enumerate(units)]
        for index, rows, lines in pool.imap_unordered(_run, tasks):
            out[index] = rows
            for line in lines:
                progress(line)
    return out
