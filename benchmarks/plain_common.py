"""What the two baseline arms (plain_loop.py, plain_trainer.py) share: arguments, data, timing rules.

Deliberately independent of memsweep: the baselines read the train subset from a JSONL file the bench
exports, tokenise it themselves, and time steps exactly as memsweep's StepTimer does (interval
between consecutive optimizer-step ends; the first `--warmup` steps are left out).
"""
import argparse
import json
import statistics
import time
from pathlib import Path


def process_start_unix() -> float:
    import psutil

    return psutil.Process().create_time()


def parse_args(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data", required=True, help="JSON lines with text and label (an integer)")
    p.add_argument("--model", required=True, help="model folder (from_pretrained)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16 = autocast, fp32 weights")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    p.add_argument("--out", required=True, help="JSON file for the result")
    return p.parse_args()


def read_data(path: str) -> tuple[list[str], list[int]]:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r["text"] for r in rows], [int(r["label"]) for r in rows]


def step_median(step_ends: list[float], warmup: int) -> tuple[float | None, int]:
    durations = [step_ends[k] - step_ends[k - 1] for k in range(max(1, warmup), len(step_ends))]
    return (statistics.median(durations) if durations else None), len(durations)


def write_result(args, arm: str, step_ends: list[float], first_step_unix: float, tokens_seen: int,
                 threads: int, loss: float) -> None:
    median, timed = step_median(step_ends, args.warmup)
    result = {"arm": arm, "dtype": args.dtype, "step_s_median": median, "steps_timed": timed,
              "startup_s": first_step_unix - process_start_unix(), "optimizer_steps": len(step_ends),
              "train_tokens_seen": tokens_seen, "threads": threads, "last_loss": loss,
              "finished_unix": time.time()}
    Path(args.out).write_text(json.dumps(result, indent=2))
