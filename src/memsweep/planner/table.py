"""The plan's tables: per GPU, the fitting rows fastest first, then those that do not fit and those a rule
refuses; printed (the top N per GPU) and written whole as plan.csv and plan.md. A fitting row whose time is a
lower bound (its step leaves a part untimed: a host optimizer step, collectives with no link figure) ranks
after every row whose time is whole, shown as ">= s": its place among them is not known."""
import csv
from pathlib import Path

from . import space

GIB = 2**30
ORDER = {"fits": 0, "does not fit": 1, "error": 2, "refused": 3}
COLUMNS = ("gpu", "rank", "status", "precision", "optim", "checkpointing", "lora", "placement", "micro_batch",
           "accumulation", "device_gib", "margin_gib", "step_s", "tokens_per_s", "changes", "method", "reason")


def ranked(rows: list[dict]) -> list[dict]:
    """Per GPU: fitting rows by predicted step time (those whose time is a lower bound after them, then those
    without one), then the others."""
    def key(r):
        return (r["gpu"], ORDER[r["status"]], r.get("step_s") is None, bool(r.get("time_note")),
                r.get("step_s") or 0.0, -(r.get("margin_bytes") or 0))

    out, seen = [], {}
    for row in sorted(rows, key=key):
        seen[row["gpu"]] = seen.get(row["gpu"], 0) + 1
        out.append({**row, "rank": seen[row["gpu"]] if row["status"] == "fits" else None})
    return out


def cells(row: dict) -> dict:
    def gib(key):
        return None if row.get(key) is None else round(row[key] / GIB, 2)

    return {"gpu": row["gpu"], "rank": row["rank"], "status": row["status"], "precision": row["precision"],
            "optim": row["optim"], "checkpointing": row["checkpointing"], "lora": row["lora"],
            "placement": placement(row),
            "micro_batch": row["micro_batch"], "accumulation": row["accumulation"], "device_gib": gib("total_bytes"),
            "margin_gib": gib("margin_bytes"),
            "step_s": None if row.get("step_s") is None else round(row["step_s"], 4),
            "tokens_per_s": None if row.get("tokens_per_s") is None else round(row["tokens_per_s"]),
            "changes": row["changes"], "method": row.get("method", ""), "reason": row.get("reason", "")}


def placement(row: dict) -> str:
    """Where the state lives, as the overrides that say so ("none": every process holds it all on its GPU)."""
    return " ".join(f"{g}={row[g]}" for g in space.PLACEMENT if row.get(g, "none") != "none") or "none"


def displayed(row: dict) -> dict:
    """A row's cells as the markdown shows them: a time that is a lower bound as ">= s" (its throughput "<=")."""
    out = cells(row)
    if row.get("time_note") and out["step_s"] is not None:
        out["step_s"], out["tokens_per_s"] = f">= {out['step_s']}", f"<= {out['tokens_per_s']}"
    return out


def markdown(rows: list[dict], top=None) -> str:
    lines = []
    for gpu in dict.fromkeys(r["gpu"] for r in rows):
        mine = [displayed(r) for r in rows if r["gpu"] == gpu]
        fitting = sum(r["status"] == "fits" for r in mine)
        shown = mine[:top] if top else mine
        lines += [f"### {gpu}: {fitting} of {len(mine)} combinations fit" + (
            f" (first {len(shown)} shown)" if len(shown) < len(mine) else ""), "",
            "| " + " | ".join(COLUMNS[1:]) + " |", "|" + "---|" * (len(COLUMNS) - 1)]
        lines += ["| " + " | ".join("" if r[c] is None else str(r[c]) for c in COLUMNS[1:]) + " |" for r in shown]
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


def write(rows: list[dict], out: Path, top: int, title: str) -> str:
    """plan.csv and plan.md (every row), and the text to print (the top rows per GPU)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "plan.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(cells(r) for r in rows)
    (out / "plan.md").write_text(f"## {title}\n\n{HEADER}{markdown(rows)}")
    return f"## {title}\n\n{HEADER}{markdown(rows, top)}"
