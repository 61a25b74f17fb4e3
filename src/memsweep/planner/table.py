"""The plan's tables: per GPU, the fitting rows fastest first, then those that do not fit and those a rule
refuses; printed (the top N per GPU) and written whole as plan.csv and plan.md. A fitting row whose time is a
lower bound (its step leaves a part untimed: a host optimizer step, collectives with no link figure) ranks
after every row whose time is whole, shown as ">= s": its place among them is not known."""
import csv
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from . import confirmed
from .confirmed import RunRow
from .depth import Figures
from .search import PlanRow

GIB = 2**30
ORDER = {"fits": 0, "does not fit": 1, "error": 2, "refused": 3}
COLUMNS = ("gpu", "rank", "status", "precision", "optim", "checkpointing", "lora", "placement", "micro_batch",
           "accumulation", "device_gib", "margin_gib", "step_s", "tokens_per_s", "changes", "method", "reason")


def ranked(rows: list[PlanRow]) -> list[PlanRow]:
    """Per GPU: fitting rows by predicted step time (those whose time is a lower bound after them, then those
    without one), then the others; each fitting row with its rank."""
    out, seen = [], {}
    for row in sorted(rows, key=order):
        seen[row.gpu] = seen.get(row.gpu, 0) + 1
        out.append(dataclasses.replace(row, rank=seen[row.gpu] if row.status == "fits" else None))
    return out


def order(row: PlanRow) -> tuple:
    """A row's place: its GPU, its status, then a time (whole before a lower bound before none), the fastest
    first, the larger margin first."""
    figures = row.figures
    if figures is None:  # nothing traced: no time, no margin
        return row.gpu, ORDER[row.status], True, False, 0.0, 0
    return (row.gpu, ORDER[row.status], figures.step_s is None, bool(figures.time_note), figures.step_s or 0.0,
            -(figures.margin_bytes or 0))


def cells(row: PlanRow) -> dict:
    """A row as plan.csv writes it: one cell per column."""
    combo = row.combination
    return {"gpu": row.gpu, "rank": row.rank, "status": row.status, "precision": combo.precision,
            "optim": combo.optim, "checkpointing": combo.checkpointing, "lora": combo.lora,
            "placement": combo.placement.overrides, "micro_batch": row.micro_batch, "accumulation": row.accumulation,
            **figure_cells(row.figures), "changes": combo.changes, "method": row.method, "reason": row.reason}


def figure_cells(figures: Figures | None) -> dict:
    """The cells of a row's figures, rounded as shown (all empty where nothing was traced)."""
    if figures is None:
        return {"device_gib": None, "margin_gib": None, "step_s": None, "tokens_per_s": None}
    return {"device_gib": gib(figures.total_bytes), "margin_gib": gib(figures.margin_bytes),
            "step_s": None if figures.step_s is None else round(figures.step_s, 4),
            "tokens_per_s": None if figures.tokens_per_s is None else round(figures.tokens_per_s)}


def gib(size: int | None) -> float | None:
    return None if size is None else round(size / GIB, 2)


def displayed(row: PlanRow) -> dict:
    """A row's cells as the markdown shows them: a time that is a lower bound as ">= s" (its throughput "<=")."""
    out = cells(row)
    if row.figures is not None and row.figures.time_note and out["step_s"] is not None:
        out["step_s"] = f">= {out['step_s']}"
        if out["tokens_per_s"] is not None:  # an image task's step counts no tokens
            out["tokens_per_s"] = f"<= {out['tokens_per_s']}"
    return out


def markdown(rows: list[PlanRow], top=None) -> str:
    lines = []
    for gpu in dict.fromkeys(r.gpu for r in rows):
        mine = [r for r in rows if r.gpu == gpu]
        fitting = sum(r.status == "fits" for r in mine)
        shown = mine[:top] if top else mine
        lines += [f"### {gpu}: {fitting} of {len(mine)} combinations fit" + (
            f" (first {len(shown)} shown)" if len(shown) < len(mine) else ""), "",
            "| " + " | ".join(COLUMNS[1:]) + " |", "|" + "---|" * (len(COLUMNS) - 1)]
        said = [displayed(r) for r in shown]
        lines += ["| " + " | ".join("" if r[c] is None else str(r[c]) for c in COLUMNS[1:]) + " |" for r in said]
        lines.append("")
    return "\n".join(lines)


HEADER = ("Predicted, not measured. device_gib: what nvidia-smi would show (the caching allocator's reserved "
          "bytes, replayed, on the safe side of packing, plus the CUDA context); margin: capacity less that (a fit "
          "needs margin >= 0). placement: where weights, gradients, optimizer state and activations live, as the "
          "overrides that say so (none: each process holds them all on its GPU). "
          "step_s: one optimizer step (micro_batch x accumulation sequences of max_seq_len tokens): a roofline "
          "per op at the rates a card reaches of its datasheet's, each op launched by the host (eager PyTorch's "
          "dispatch, measured on an H200's host), several processes' collectives and optimizer offload's host "
          "copies where they outlast the compute they overlap; no data loading; tokens_per_s from it, over every "
          "process. \">= s\": a lower bound, its reason "
          "says what is not timed; such rows rank after those timed whole. method: how the memory was traced.\n\n")


@dataclass(frozen=True)
class Written:
    """What plan.csv and plan.md hold beside the rows: each fitting row's command, and the rows run (plan.run)."""
    commands: dict[tuple[str, int], str]  # (gpu, rank) -> the row's job as one command line (planner/command.py)
    runs: list[RunRow] = field(default_factory=list)
    plot: Path | None = None  # predicted against measured, beside plan.md


def write(rows: list[PlanRow], out: Path, top: int, title: str, written: Written) -> str:
    """plan.csv and plan.md (every row, each fitting row's command, the run rows' measurements), and the text to
    print (the top rows per GPU)."""
    out.mkdir(parents=True, exist_ok=True)
    run = {(r.row.gpu, r.row.rank): r for r in written.runs}
    with open(out / "plan.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS + RUN_COLUMNS)
        writer.writeheader()
        writer.writerows({**cells(r), **run_cells(run.get((r.gpu, r.rank)), written.commands.get((r.gpu, r.rank)))}
                         for r in rows)
    ran = f"\n{confirmed.markdown(written.runs, written.plot)}" if written.runs else ""
    (out / "plan.md").write_text(f"## {title}\n\n{HEADER}{markdown(rows)}{ran}\n{commands_md(written.commands)}")
    return f"## {title}\n\n{HEADER}{markdown(rows, top)}"


RUN_COLUMNS = ("measured_rank", "measured_step_s", "measured_gib", "measured_counter", "run_status", "command")


def run_cells(run: RunRow | None, line: str | None) -> dict:
    """A row's cells of its run (empty where it was not run) and its command (fitting rows)."""
    if run is None:
        return {**dict.fromkeys(RUN_COLUMNS), "command": line}
    said = confirmed.cells(run)
    return {"measured_rank": run.measured_rank, "measured_step_s": said["measured_step_s"],
            "measured_gib": said["measured_gib"], "measured_counter": run.measured.counter,
            "run_status": run.measured.status, "command": line}


def commands_md(commands: dict[tuple[str, int], str]) -> str:
    """plan.md's last section: each fitting row's job as one command, by GPU and rank."""
    lines = ["## Each fitting row as a command", ""]
    lines += [f"- {gpu} rank {rank}: `{line}`" for (gpu, rank), line in commands.items()]
    return "\n".join(lines) + "\n"
