"""The time a published row prints, as seconds per optimizer step, beside the estimate's predicted step time
(estimate/roofline.py: each op's roofline, launched by the host), and whether a ladder's rows come out in
the published order.

Each source's time column (`time_elapsed`, `time_per_step`, `imgs_per_sec`, `toks_per_sec`, ...) is read as
seconds per optimizer step; a loop's stated validation passes are predicted too.
How each column is read: docs/guide/benchmarks.md.
"""
import math
import re
from typing import Any

import pandas as pd

TOLERANCE_PCT = 30.0  # the bound for a predicted time against a published one
SECONDS = {"s": 1.0, "min": 60.0, "h": 3600.0}


def published_step_s(row: dict[str, Any], est: dict[str, Any]) -> float | None:
    """Seconds per optimizer step as the row prints them, or None."""
    if "time_elapsed" in row:
        value, unit = str(row["time_elapsed"]).split()
        return float(value) * SECONDS[unit] / int(row["optimizer_steps"])
    if "time_per_step" in row:
        found = re.fullmatch(r"([\d.]+)\s*s/it", str(row["time_per_step"]).strip())
        return float(found.group(1)) if found else None
    per_step = {"imgs_per_sec": est["micro_batch_size"] * est["accumulation_steps"],
                "toks_per_sec": est["micro_batch_size"] * est["accumulation_steps"] * est["seq_len"]}
    per_step["tokens_per_sec"] = per_step["tps_per_gpu"] = per_step["toks_per_sec"]
    for key, amount in per_step.items():
        if key in row:
            rate = pd.to_numeric(str(row[key]).replace(",", ""), errors="coerce")  # "5,762" as printed
            return None if pd.isna(rate) or rate <= 0 else amount / float(rate)
    return None


def evaluation_s_per_step(row: dict[str, Any], common: dict[str, Any], est: dict[str, Any]) -> float:
    """The timed loop's validation passes, predicted, per optimizer step (0 where the table states none)."""
    examples = common.get("timed_evaluation_examples")
    if not examples or "time_elapsed" not in row:
        return 0.0
    ranks = int(row.get("num_gpus", common.get("num_gpus", 1)))
    batches = int(common.get("epochs", 1)) * math.ceil(examples / ranks / est["micro_batch_size"])
    return batches * est["step_time"]["forward_only_s"] / int(row["optimizer_steps"])


def columns(row: dict[str, Any], est: dict[str, Any], timed_card: bool = True,
            common: dict[str, Any] | None = None) -> dict[str, float | None]:
    """The row's time columns: published and predicted seconds per step and the error (None where either is
    missing: the estimate says why in its step_time's why_not; and no published time where the estimate's
    profile is not the card that measured it, `timed_card` False: the table's `time_on_profile: false`).
    The prediction is of what the published time covers: the step, and the loop's stated validation passes."""
    published = published_step_s(row, est) if timed_card else None
    predicted = est.get("predicted_step_s")
    if predicted:
        predicted += evaluation_s_per_step(row, common or {}, est)
    error = None if not published or not predicted else 100 * (predicted - published) / published
    return {"published s/step": published, "predicted s/step": predicted, "time error %": error}


def ladder_order(frame: pd.DataFrame) -> dict[str, float]:
    """{table: Spearman's rank correlation of predicted and published step time} over its rows with both
    (three at least): whether the ladder's techniques are predicted to cost time in the published order."""
    out = {}
    timed = frame[frame["time error %"].notna()]
    for table, rows in timed.groupby("table", sort=False):
        if len(rows) >= 3:
            out[table] = float(rows["predicted s/step"].rank().corr(rows["published s/step"].rank()))
    return out


def summary(frame: pd.DataFrame) -> list[str]:
    timed = frame["time error %"].notna()
    if not timed.any():
        return ["no modelled row prints a time"]
    within = int((frame.loc[timed, "time error %"].abs() <= TOLERANCE_PCT).sum())
    lines = [f"{int(timed.sum())} modelled rows print a time; {within} within ±{TOLERANCE_PCT:.0f} % of it "
             f"(predicted seconds per optimizer step: the roofline, launched by the host); median |error| "
             f"{frame.loc[timed, 'time error %'].abs().median():.1f} %"]
    lines += [f"  {table}: Spearman {rho:+.2f} (predicted against published order by time)"
              for table, rho in ladder_order(frame).items()]
    return lines
