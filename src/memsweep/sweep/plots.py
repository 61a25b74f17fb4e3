"""The sweep summary's plots: memory.png (stacked bars of what holds the peak) and tradeoff.png
(peak memory against train time, labelled with F1). Drawn from the jobs sweep.py collected."""
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .sweepdir import SweepJob, as_dict

GIB = 2**30
# Stacks of memory.png and breakdown columns of summary.md; "other" gathers buffers and temporaries.
PARTS = ("params", "grads", "optimizer", "activations", "other")
COLORS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52",
          "other": "#8c8c8c"}


def parts_gib(job: SweepJob) -> dict[str, float | None]:
    """The peak's breakdown in GiB: what was alive at the peak, summing to the peak."""
    breakdown = job.get("memory.peak_breakdown") if job.ok else None
    if not breakdown:
        return {p: None for p in PARTS}
    other = sum(breakdown.get(k, 0) or 0 for k in ("buffers", "temp", "other"))
    return {p: (other if p == "other" else breakdown.get(p, 0) or 0) / GIB for p in PARTS}


def _label(job: SweepJob, varying: list[str]) -> str:
    overrides = as_dict(job.overrides)
    shown = [f"{k}={overrides[k]}" for k in varying if k in overrides] or job.overrides
    return f"#{job.num} " + (" ".join(shown) or "default")


def plot_memory(jobs: list[SweepJob], varying: list[str], path: Path) -> None:
    """Horizontal stacked bars, one per job in job order (horizontal: long labels and many jobs fit)."""
    fig = Figure(figsize=(10, 1.5 + 0.45 * len(jobs)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ys = list(range(len(jobs)))[::-1]  # first job on top
    left = [0.0] * len(jobs)
    for part in PARTS:
        widths = [parts_gib(j)[part] or 0.0 for j in jobs]
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


def plot_tradeoff(jobs: list[SweepJob], baseline: SweepJob, varying: list[str], path: Path) -> None:
    fig = Figure(figsize=(8, 6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ok = [j for j in jobs if j.ok and j.get("memory.peak_bytes") and j.get("time.train_s")]
    for job in ok:
        x, y = job.get("time.train_s"), job.get("memory.peak_bytes") / GIB
        is_base = job is baseline
        ax.scatter([x], [y], s=70, marker="*" if is_base else "o", color="#c44e52" if is_base else "#4c72b0",
                   zorder=3)
        f1, ppl = job.get("metrics.f1"), job.get("metrics.perplexity")
        quality = f"F1 {f1:.3f}" if f1 is not None else f"ppl {ppl:.1f}" if ppl is not None else "F1 –"
        ax.annotate(quality, (x, y), xytext=(6, 5),
                    textcoords="offset points", fontsize=9, fontweight="bold")
        ax.annotate(_label(job, varying), (x, y), xytext=(6, -9), textcoords="offset points", fontsize=7,
                    color="#555555")
    left_out = [f"#{j.num} {j.status}" for j in jobs if j not in ok]
    if left_out:
        ax.text(0.01, 0.01, "not plotted: " + ", ".join(left_out), transform=ax.transAxes, fontsize=8,
                color="#b22222", va="bottom")
    ax.set_xlabel("train time (s)")
    ax.set_ylabel("peak memory (GiB)")
    ax.set_title("Memory against time (★ baseline); labels: macro-F1 or perplexity")
    # from zero, so distances read as proportions; headroom for the labels
    ax.set_xlim(0, max([j.get("time.train_s") for j in ok], default=1) * 1.4)
    ax.set_ylim(0, max([j.get("memory.peak_bytes") / GIB for j in ok], default=1) * 1.2)
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120)
