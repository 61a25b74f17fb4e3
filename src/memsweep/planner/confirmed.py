"""The plan confirmed by running it (plan.run): each run row's predicted step time and memory beside what its
job measured, each with its counter, the ranks both ways, and how far the plan's order holds: the rank
correlation, the time errors, the regret of the row ranked first, and the rows whose memory was predicted
under (those are the rows that would run out of memory). Read by plan.md, plan.csv and `make plan-check`."""
import statistics
from dataclasses import dataclass
from pathlib import Path

from .search import PlanRow


@dataclass(frozen=True)
class Measured:
    """What a run row's job measured (its results.json)."""
    status: str  # the job's status: ok, oom, failed, refused...
    reason: str
    step_s: float | None  # the median optimizer step after the warm-up (and the ledger's padded, traced step)
    memory_bytes: int | None  # on a GPU max_memory_allocated, on a CPU the ledger's peak: as the plan predicts it
    reserved_bytes: int | None  # on a GPU max_memory_reserved; None on a CPU
    counter: str  # the counter memory_bytes was read from


@dataclass(frozen=True)
class RunRow:
    """A plan row that was run, with what it measured and its rank among the run rows of its GPU."""
    row: PlanRow
    measured: Measured
    measured_rank: int | None  # by measured step time among the GPU's run rows that ended ok

    @property
    def predicted_memory_bytes(self) -> int | None:
        figures = self.row.figures
        return None if figures is None else figures.allocated_bytes

    @property
    def time_error(self) -> float | None:
        """Predicted over measured step time, less 1 (+0.1: predicted 10 % slow)."""
        predicted, measured = self.row.figures.step_s if self.row.figures else None, self.measured.step_s
        return predicted / measured - 1 if predicted and measured else None

    @property
    def memory_error(self) -> float | None:
        predicted, measured = self.predicted_memory_bytes, self.measured.memory_bytes
        return predicted / measured - 1 if predicted and measured else None


def ranked(rows: list[PlanRow], measured: list[Measured]) -> list[RunRow]:
    """Each run row with its measured rank: per GPU, the rows that ended ok, fastest measured first."""
    out = []
    for gpu in dict.fromkeys(r.gpu for r in rows):
        mine = [(r, m) for r, m in zip(rows, measured) if r.gpu == gpu]
        timed = sorted((m.step_s, i) for i, (_, m) in enumerate(mine) if m.status == "ok" and m.step_s)
        place = {i: n for n, (_, i) in enumerate(timed, 1)}
        out += [RunRow(r, m, place.get(i)) for i, (r, m) in enumerate(mine)]
    return out


@dataclass(frozen=True)
class Agreement:
    """How well one GPU's run rows agree with the plan (rows that ended ok and have both figures)."""
    gpu: str
    rows: int
    spearman: float | None  # rank correlation of predicted and measured step time (None under 3 rows)
    median_time_error: float | None
    largest_time_error: float | None  # the largest by magnitude, with its sign
    regret: float | None  # how much slower the plan's first row measured than the fastest measured (0: it is)
    median_memory_error: float | None
    largest_memory_error: float | None
    memory_under: int  # rows whose memory was predicted below what was measured


def agreement(runs: list[RunRow], gpu: str) -> Agreement:
    import pandas as pd

    done = [r for r in runs if r.row.gpu == gpu and r.time_error is not None]
    times = [r.time_error for r in done]
    memory = [r.memory_error for r in done if r.memory_error is not None]
    spearman = None
    if len(done) >= 3:
        spearman = float(pd.Series([r.row.figures.step_s for r in done]).corr(
            pd.Series([r.measured.step_s for r in done]), method="spearman"))
    first = min(done, key=lambda r: r.row.rank, default=None)
    fastest = min((r.measured.step_s for r in done), default=None)
    return Agreement(
        gpu=gpu, rows=len(done), spearman=spearman,
        median_time_error=statistics.median(times) if times else None,
        largest_time_error=max(times, key=abs) if times else None,
        regret=first.measured.step_s / fastest - 1 if first and fastest else None,
        median_memory_error=statistics.median(memory) if memory else None,
        largest_memory_error=max(memory, key=abs) if memory else None,
        memory_under=sum(e < 0 for e in memory))


def percent(value: float | None) -> str:
    return "" if value is None else f"{value:+.1%}"


def said(a: Agreement) -> str:
    """One line of a GPU's agreement."""
    if not a.rows:
        return f"{a.gpu}: no run row ended ok with a step time"
    spearman = "n/a (under 3 rows)" if a.spearman is None else f"{a.spearman:.2f}"
    return (f"{a.gpu}: {a.rows} rows; Spearman {spearman}; time error median {percent(a.median_time_error)}, "
            f"largest {percent(a.largest_time_error)}; the first row {percent(a.regret)} slower than the fastest "
            f"measured; memory error median {percent(a.median_memory_error)}, largest "
            f"{percent(a.largest_memory_error)}; {a.memory_under} of {a.rows} rows predicted under")


COLUMNS = ("rank", "measured_rank", "status", "predicted_step_s", "measured_step_s", "time_error",
           "predicted_gib", "measured_gib", "memory_error", "counter", "reason")


def cells(run: RunRow) -> dict:
    """A run row's cells (the confirmation table of plan.md)."""
    gib = 2**30
    m, predicted = run.measured, run.predicted_memory_bytes
    return {"rank": run.row.rank, "measured_rank": run.measured_rank, "status": m.status,
            "predicted_step_s": None if run.row.figures is None else round(run.row.figures.step_s or 0, 4),
            "measured_step_s": None if m.step_s is None else round(m.step_s, 4), "time_error": percent(run.time_error),
            "predicted_gib": None if predicted is None else round(predicted / gib, 3),
            "measured_gib": None if m.memory_bytes is None else round(m.memory_bytes / gib, 3),
            "memory_error": percent(run.memory_error), "counter": m.counter, "reason": m.reason}


def markdown(runs: list[RunRow], plot: Path | None) -> str:
    """plan.md's section: per GPU its agreement line and table, and the plot of predicted against measured."""
    lines = ["## Confirmed by running (plan.run)", ""]
    for gpu in dict.fromkeys(r.row.gpu for r in runs):
        lines += [f"### {gpu}", "", said(agreement(runs, gpu)), "", "| " + " | ".join(COLUMNS) + " |",
                  "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join("" if v is None else str(v) for v in cells(r).values()) + " |"
                  for r in runs if r.row.gpu == gpu]
        lines.append("")
    if plot is not None:
        lines += [f"![predicted against measured]({plot.name})", ""]
    return "\n".join(lines)


def plot(runs: list[RunRow], path: Path) -> Path | None:
    """Predicted against measured step time and memory, one point per run row that ended ok."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    done = [r for r in runs if r.time_error is not None]
    if not done:
        return None
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    pairs = (("step time (s)", [r.row.figures.step_s for r in done], [r.measured.step_s for r in done]),
             ("memory (GiB)", [(r.predicted_memory_bytes or 0) / 2**30 for r in done],
              [(r.measured.memory_bytes or 0) / 2**30 for r in done]))
    for n, (what, predicted, measured) in enumerate(pairs, 1):
        ax = fig.add_subplot(1, 2, n)
        ax.scatter(measured, predicted)
        for r, x, y in zip(done, measured, predicted):
            ax.annotate(str(r.row.rank), (x, y), fontsize=8)
        top = max(measured + predicted) * 1.05
        ax.plot([0, top], [0, top], color="#8c8c8c", linewidth=1)
        ax.set(xlabel=f"measured {what}", ylabel=f"predicted {what}", xlim=(0, top), ylim=(0, top),
               title=f"{what}: labels are the plan's ranks")
    fig.savefig(path, dpi=110)
    return path
