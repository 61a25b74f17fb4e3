"""`make gpu-check`: the GPU acceptance run, for whoever has a CUDA GPU.

A small grid (precision fp32/fp16/bf16 x optim adamw/adamw_8bit/adafactor x checkpointing none/full) on
the embedded MiniLM and on bert-base-sized random weights, torchao's 8- and 4-bit AdamW and its optimizer
CPU offload (with and without the gradients) on the bert-base shape, and a decoder grid (optim x
full/LoRA/QLoRA in bf16) on a 0.48B Llama-style decoder with random weights, a few optimizer steps each, through the
ordinary `python train.py -m` path with `hardware=auto` (the GPU's own profile). Writes
benchmarks/GPU.md: per job, predicted against measured for the three counters a GPU has (peak
allocated, peak reserved, nvidia-smi "used"), the time per step, and the `effective` audit showing
each technique really in effect on CUDA (GradScaler for fp16, the compute dtype, the optimizer and its
state bytes, the attention kernel). Without a GPU it says so, runs nothing and exits 0.
"""
import argparse
import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's memsweep

from memsweep.sweep import sweepdir  # noqa: E402

GRID = ["precision=fp32,fp16,bf16", "optim=adamw,adamw_8bit,adafactor", "checkpointing=none,full"]
# A decoder's grid: the adapters (LoRA, and QLoRA's NF4 weights through bitsandbytes' CUDA kernels) x optim
DECODER_GRID = ["precision=bf16", "optim=adamw,adamw_8bit", "lora=none,r16,qlora"]
BERT_BASE = ["model=tiny", "model.hidden_size=768", "model.num_layers=12", "model.num_heads=12",
             "model.intermediate_size=3072"]
MODELS = {
    "minilm": GRID + ["model=minilm"],
    # bert-base's shape (110M parameters) with random weights: no download needed
    "bert-base-random": GRID + BERT_BASE,
    # torchao's low-bit AdamW (compiled steps) and its CPU offload of the optimizer, on the same shape
    "bert-base-torchao": ["precision=bf16", "optim=adamw_torch_8bit,adamw_torch_4bit"] + BERT_BASE,
    "bert-base-offload": ["precision=bf16", "offload=optimizer,optimizer_and_grads"] + BERT_BASE,
    # the 2-layer, 64-wide BERT: each op a launch, so the host's dispatch of the ops paces the step
    "tiny-launch-bound": ["precision=fp32,bf16", "checkpointing=none,full", "model=tiny"],
    # a Llama-style decoder of 0.48B parameters (TinyLlama's widths, 8 layers, untied head) with random weights
    "llama-random": DECODER_GRID + ["task=causal_lm", "model=tiny-llama", "model.hidden_size=2048",
                                    "model.num_layers=8", "model.num_heads=32", "model.num_kv_heads=4",
                                    "model.intermediate_size=5632"],
}
# Short jobs: the memory ledger is step 2; a few more steps time a step.
SMALL = ["hardware=auto", "logger=none", "data.train_size=320", "data.eval_size=64",
         "max_seq_len=128"]
GIB = 2**30
# (predicted, measured) results.json fields for each counter; a prediction the estimate does not make is "–"
COUNTERS = {
    "allocated": ("estimate.peak_allocated_bytes", "memory.cuda_max_allocated"),
    "reserved": ("estimate.peak_reserved_bytes", "memory.cuda_max_reserved"),
    "used": ("estimate.device_used_bytes", "memory.device_used_bytes"),
}
AUDIT = ("compute_dtype", "grad_scaler", "optimizer", "optimizer_kernel", "optimizer_state_bytes", "attention",
         "checkpointed_layers", "emulated_precision")


def _gib(value: float | None) -> str:
    return "–" if value is None else f"{value / GIB:.3f}"


def _error(predicted: float | None, measured: float | None) -> str:
    return "–" if not predicted or not measured else f"{100 * (predicted - measured) / measured:+.1f} %"


def rows(model: str, jobs: list[sweepdir.SweepJob]) -> list[dict[str, Any]]:
    """One row per job of a model's sweep: what varied, the status, the counters and the audit."""
    out = []
    for job in jobs:
        # the grid's name last: a model=... override must not replace it
        row: dict[str, Any] = {**sweepdir.as_dict(job.overrides), "model": model, "status": job.status}
        for name, (predicted_key, measured_key) in COUNTERS.items():
            predicted, measured = job.get(predicted_key), job.get(measured_key)
            row[f"{name} predicted GiB"] = _gib(predicted)
            row[f"{name} measured GiB"] = _gib(measured)
            row[f"{name} error"] = _error(predicted, measured)
        # the safe side of packing, which fits and autofit use: it should not be below the measured reserved
        row["reserved upper error"] = _error(job.get("estimate.reserved_upper_bytes"),
                                             job.get("memory.cuda_max_reserved"))
        row["context measured GiB"] = _gib(job.get("memory.cuda_context_bytes"))  # "used" beside the allocator
        step, predicted = job.get("time.step_s_median"), job.get("estimate.predicted_step_s")
        row["ms/step"] = "–" if step is None else f"{step * 1e3:.1f}"
        # the roofline's lower bound at the profile's datasheet rates, and the ops the host dispatches per step
        row["ms/step predicted"] = "–" if predicted is None else f"{predicted * 1e3:.1f}"
        ops = [job.get(f"estimate.step_time.{k}") for k in ("ops_per_micro_batch", "ops_in_optimizer_step")]
        row["ops/step"] = "–" if None in ops else str(sum(ops))
        row.update({key: str(job.get(f"effective.{key}")) for key in AUDIT})
        if not job.ok:
            row["reason"] = job.reason
        out.append(row)
    return out


def table(all_rows: list[dict[str, Any]]) -> str:
    frame = pd.DataFrame(all_rows).fillna("")
    frame = frame[["model"] + [column for column in frame.columns if column != "model"]]
    return frame.to_markdown(index=False, disable_numparse=True)


def write_report(path: Path, all_rows: list[dict[str, Any]], gpu: str, command: str) -> None:
    import torch

    header = [f"# GPU acceptance run ({dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC)", "",
              f"GPU: {gpu}; torch {torch.__version__}, CUDA {torch.version.cuda}. Command: `{command}`.", "",
              "Predicted = the job's estimate, made before it trained; measured = torch.cuda.max_memory_allocated, "
              "max_memory_reserved and NVML's used (what nvidia-smi shows) at the end of the job. "
              "A dash: the estimate does not predict that counter, or the job did not measure it.", ""]
    path.write_text("\n".join(header) + table(all_rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "GPU.md")
    parser.add_argument("--sweeps", type=Path, default=ROOT / "multirun" / "gpu-check")
    parser.add_argument("--models", default=",".join(MODELS), help=f"a comma-separated subset of {', '.join(MODELS)}")
    parser.add_argument("--max-steps", type=int, default=8, help="optimizer steps per job (more: steadier ms/step)")
    args = parser.parse_args(argv)
    if unknown := set(args.models.split(",")) - set(MODELS):
        parser.error(f"--models: unknown {', '.join(sorted(unknown))}; choose from {', '.join(MODELS)}")
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU on this machine, nothing was run and benchmarks/GPU.md is unchanged; "
              "run `make gpu-check` where nvidia-smi shows a GPU (predict GPUs here with mode=estimate)")
        return 0
    gpu = torch.cuda.get_device_name(0)
    all_rows = []
    for model in args.models.split(","):
        overrides = MODELS[model]
        sweep_dir = args.sweeps / model
        command = [sys.executable, "train.py", "-m", *overrides, *SMALL, f"max_steps={args.max_steps}",
                   f"hydra.sweep.dir={sweep_dir}"]
        print("gpu-check: " + " ".join(command[1:]), flush=True)
        subprocess.run(command, cwd=ROOT)  # a failed job is a row; the sweep's own exit code is not ours
        all_rows += rows(model, sweepdir.collect(sweep_dir))
        label = ("make gpu-check" if args.models == ",".join(MODELS)
                 else f"benchmarks/gpu_check.py --models {args.models}")
        write_report(args.out, all_rows, gpu, label)  # after each model: a cut-short run keeps its rows
    print(f"gpu-check: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
