"""`make validate-estimates`: the estimator against published GPU memory measurements.

Every table in benchmarks/published/ (one YAML file per source, with its set-up and the counter it
reports) is read; each row memsweep can express as a job is estimated offline on the matching GPU
profile, and its prediction for *that* counter (peak allocated, peak reserved, or device used) is put
beside the published figure with the error. Where the source also prints a time, the predicted step
time is put beside it (published_time.py), with each ladder's rank order. A row that cannot be expressed
is listed with the reason. No constant is fitted to these tables: they only check. Exit 1 when a
modelled row's memory is off by more than the tolerance (10 %).
"""
import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's memsweep
sys.path.insert(0, str(ROOT / "benchmarks"))
import published_time  # noqa: E402
from decoder_rows import TABLES as DECODER_TABLES  # noqa: E402
from decoder_rows import NotModelled  # noqa: E402
from older_libraries import adjustments, stepping_as  # noqa: E402
from vision_rows import TABLES as VISION_TABLES  # noqa: E402

PUBLISHED = ROOT / "benchmarks" / "published"
TOLERANCE_PCT = 10.0
GIB = 2**30
# The published counter -> the estimate's field that predicts it. torchtune's "active" peak counts
# live blocks, as max_memory_allocated does.
COUNTER_FIELD = {"max_memory_allocated": "peak_allocated_bytes", "active_bytes_peak": "peak_allocated_bytes",
                 "max_memory_reserved": "peak_reserved_bytes", "nvidia_smi_used": "device_used_bytes"}
UNIT_BYTES = {"GB": 1e9, "GiB": 2**30, "MiB": 2**20, "MB": 1e6}


# --- published rows as memsweep jobs -------------------------------------------------------------

DISTILBERT_PRECISION = {"fp32": "fp32", "fp16_mixed": "fp16", "bf16_mixed": "bf16", "bf16_true": "bf16_true",
                        "fp16_true": "fp16_true", "fp64": "fp64"}


def distilbert_precision_ladder(row: dict[str, Any], common: dict[str, Any]) -> list[str]:
    precision = str(row["precision"]).split()[0]
    if precision not in DISTILBERT_PRECISION:
        raise NotModelled(f"{precision}: no memsweep precision")
    name = DISTILBERT_PRECISION[precision]
    if name == "fp32" and str(row.get("float32_matmul_precision", "highest")).split()[0] != "highest":
        name = "tf32"  # torch.set_float32_matmul_precision('high'/'medium'): TF32 matmuls, the same bytes
    # transformers 4.28's DistilBERT attention is eager; torch.optim.Adam keeps AdamW's two moments
    return ["model=distilbert", "hardware=a100_40gb", "batch_size=12", "max_seq_len=512", f"precision={name}",
            "optim=adamw_torch", "attention=eager"]


def bert_large_rtx3090(row: dict[str, Any], common: dict[str, Any]) -> list[str]:
    return ["model=bert-large", "hardware=rtx3090", f"batch_size={row['micro_batch']}",
            f"max_seq_len={row['seq_len']}", "precision=fp32", "optim=adamw_torch", "attention=eager"]


def several_gpus(row: dict[str, Any], common: dict[str, Any]) -> tuple[list[str], str]:
    if "bigbird" in str(row["model"]):
        raise NotModelled("BigBird-RoBERTa (block-sparse attention): no shipped config, and the sequence length is "
                          "not stated")
    n, mb, acc = int(row["num_gpus"]), int(row["micro_batch"]), int(row["gradient_accumulation"])
    job = ["model=distilbert", "hardware=a100_40gb", f"batch_size={mb * acc * n}", f"accumulation.steps={acc}",
           "max_seq_len=512", "optim=adamw_torch", "attention=eager", f"distributed.nproc={n}"]
    if str(row["distributed"]).startswith("DeepSpeed"):
        # Fabric's DeepSpeedStrategy defaults (lightning/fabric/strategies/deepspeed.py): 2e8-value reduce
        # buckets, two of them with overlap_comm=True, in the fp16 the engine trains in
        job += ["deepspeed=zero2", "precision=fp16", "deepspeed.reduce_bucket_size=200000000",
                "deepspeed.overlap_comm=true"]
    else:  # Fabric's FSDP1 with cpu_offload=True, each TransformerBlock a unit
        job += ["fsdp=full_shard_offload", "fsdp.version=1", "precision=bf16_true"]
    return job, ("GPU not stated: an A100-40GB as in the source's other rows (reserved is the same on every CUDA "
                 "profile); rank 0 of the training step, where the source prints the whole run's peak (training, "
                 "validation and test)")


# file stem -> how its rows become a job (or why they cannot)
TABLES: dict[str, Callable[[dict[str, Any], dict[str, Any]], list[str]]] = {
    "rasbt_distilbert_imdb_precision": distilbert_precision_ladder,
    "mscherrmann_bert_large_rtx3090": bert_large_rtx3090,
    "rasbt_distilbert_bigbird_imdb_4gpu": several_gpus,
    **VISION_TABLES,  # vision_rows.py
    **DECODER_TABLES,  # decoder_rows.py
}


def job_for(stem: str, row: dict[str, Any], common: dict[str, Any]) -> tuple[list[str], str]:
    """The row's job overrides and a caveat (empty where the job is the set-up as published)."""
    if stem not in TABLES:
        raise NotModelled(f"no mapping of {stem}.yaml's rows to jobs yet (validate_estimates.TABLES)")
    made = TABLES[stem](row, common)
    return made if isinstance(made, tuple) else (made, "")


# --- the check ------------------------------------------------------------------------------------

def published_bytes(row: dict[str, Any]) -> float | None:
    if row.get("memory") is None:
        return None  # an out-of-memory row: nothing to compare
    return float(row["memory"]) * UNIT_BYTES[unit(row)]


def unit(row: dict[str, Any]) -> str:
    """The unit as published (its first word; a note on an ambiguous unit may follow)."""
    return str(row["unit"]).split()[0]


def estimate(overrides: list[str], cache: dict, older: tuple[str, ...] = ()) -> dict[str, Any]:
    """One estimate per distinct job (several published rows can be the same job), stepped as the table's
    libraries did where they are older (older_libraries.py)."""
    key = (tuple(overrides), older)
    if key not in cache:
        from memsweep.app.estimate import compose
        from memsweep.config import hardware, validate
        from memsweep.estimate.core import estimate_job

        job = compose(overrides)
        validate.ranges(job)
        with stepping_as(list(older)):
            cache[key] = estimate_job(job, hardware.detect(job.hardware)).to_dict()
    return cache[key]


def out_of_memory(overrides: list[str], cache: dict, older: tuple[str, ...] = ()) -> str:
    """An out-of-memory row has no figure to compare; whether the estimate also says it does not fit."""
    try:
        est = estimate(overrides, cache, older)
    except NotModelled as exc:
        return f"out of memory in the source: no figure ({exc})"
    verdict = "agrees" if est["fits"] is False else "DISAGREES"
    return (f"out of memory in the source: no figure; predicted {est['total_bytes'] / GIB:.1f} GiB used of "
            f"{est['capacity_bytes'] / GIB:.1f} GiB, {'fits' if est['fits'] else 'does not fit'} ({verdict})")


def check(files: list[Path]) -> pd.DataFrame:
    rows, cache = [], {}
    for path in files:
        table = yaml.safe_load(path.read_text())
        counter = table["counter"]
        for row in table["rows"]:
            older = tuple(adjustments(table, row))
            out = {"table": path.stem, "row": row["label"], "counter": counter,
                   "published GiB": None, "predicted GiB": None, "error %": None,
                   "published s/step": None, "predicted s/step": None, "time error %": None, "note": ""}
            published = published_bytes(row)
            out["published GiB"] = None if published is None else published / GIB
            try:
                if counter not in COUNTER_FIELD:
                    raise NotModelled(f"the source's counter is {counter}")
                overrides, caveat = job_for(path.stem, row, table.get("common", {}))
                if published is None:
                    raise NotModelled(out_of_memory(overrides, cache, older))
                est = estimate(overrides, cache, older)
                predicted = est.get(COUNTER_FIELD[counter])
                if predicted is None:
                    raise NotModelled(f"the estimate ({est['method']}) predicts no {COUNTER_FIELD[counter]}")
                out.update(published_time.columns(row, est, table.get("time_on_profile", True),
                                                   table.get("common", {})))
                out.update({"predicted GiB": predicted / GIB, "error %": 100 * (predicted - published) / published,
                            "note": f"{est['method']} on {est['hardware']}" + "".join(
                                f"; as the source's library: {name}" for name in older)
                                    + (f"; {caveat}" if caveat else "")})
            except NotModelled as exc:
                out["note"] = f"not modelled: {exc}"
            rows.append(out)
    frame = pd.DataFrame(rows)
    numbers = ["published GiB", "predicted GiB", "error %", "published s/step", "predicted s/step", "time error %"]
    frame[numbers] = frame[numbers].apply(pd.to_numeric)  # a table of no modelled row holds None alone
    return frame


def report(frame: pd.DataFrame) -> str:
    shown = frame.copy()
    for column, spec in (("published GiB", "{:.3f}"), ("predicted GiB", "{:.3f}"), ("error %", "{:+.1f}"),
                         ("published s/step", "{:.3f}"), ("predicted s/step", "{:.3f}"), ("time error %", "{:+.1f}")):
        shown[column] = [("–" if pd.isna(v) else spec.format(v)) for v in shown[column]]
    modelled = frame["error %"].notna()
    within = (frame["error %"].abs() <= TOLERANCE_PCT) & modelled
    lines = [shown.to_markdown(index=False, disable_numparse=True), "",
             f"{int(modelled.sum())} of {len(frame)} published rows modelled; {int(within.sum())} within "
             f"±{TOLERANCE_PCT:.0f} % of the published figure on its own counter"]
    if modelled.any():
        lines.append(f"median |error| {frame.loc[modelled, 'error %'].abs().median():.1f} %, "
                     f"largest {frame.loc[modelled, 'error %'].abs().max():.1f} %")
        lines += under_lines(frame[modelled])
    return "\n".join(lines + published_time.summary(frame))


def under_lines(modelled: pd.DataFrame) -> list[str]:
    """The rows predicted below the published figure (those a user would run out of memory on), in total and
    per table: how many, and the largest under-prediction."""
    def line(name: str, errors: pd.Series) -> str:
        under = errors[errors < 0]
        worst = f"largest under {under.min():+.1f} %" if len(under) else "none under"
        return (f"{name}: {len(under)} of {len(errors)} ({100 * len(under) / len(errors):.0f} %) predicted under "
                f"the published figure ({worst})")

    lines = [line("all modelled rows", modelled["error %"])]
    lines += ["  " + line(table, group["error %"]) for table, group in modelled.groupby("table", sort=True)]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="published tables (default: all of benchmarks/published)")
    args = parser.parse_args(argv)
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sizes come from the shipped configs, never the hub
    files = args.files or sorted(PUBLISHED.glob("*.yaml"))
    frame = check(files)
    print(report(frame))
    off = frame["error %"].notna() & (frame["error %"].abs() > TOLERANCE_PCT)
    return 1 if off.any() else 0


if __name__ == "__main__":
    sys.exit(main())
