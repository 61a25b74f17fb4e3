"""One job, top to bottom: check -> build -> apply the techniques -> train -> evaluate -> results.json.

Every ending is a result: `ok`, `unsupported` (a rule refused it), `oom`, `diverged`, or `failed`
(any other error, traceback in the job log). results.json is always written and the W&B run always
finished, so a sweep loses nothing and goes on to its next job.
"""
import gc
import os
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from . import hardware, measure, results, resume, rules, shapes, wandb_log
from .errors import ConfigError, Diverged, Unsupported
from .schema import Config, Mode

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
if not torch.cuda.is_available():  # else DeepSpeed probes for accelerators and warns on every import
    os.environ.setdefault("DS_ACCELERATOR", "cpu")


def hydra_context() -> tuple[Path, list[str], str]:
    """(job output dir, this job's overrides, the sweep/run id used as W&B group)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    root = hc.sweep.dir if hc.mode == RunMode.MULTIRUN else hc.run.dir
    return Path(hc.runtime.output_dir), list(hc.overrides.task), str(root).strip("/").replace("/", "_")


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def outcome(exc: BaseException) -> tuple[str, str]:
    """(status, reason) of a job that raised `exc`."""
    if isinstance(exc, Unsupported):
        return "unsupported", str(exc)
    if isinstance(exc, Diverged):
        return "diverged", str(exc)
    if isinstance(exc, ConfigError):
        return "failed", f"bad input: {exc}"
    if is_oom(exc):
        return "oom", f"{type(exc).__name__}: {str(exc)[:300]}"
    return "failed", f"{type(exc).__name__}: {str(exc)[:500]}"


def run(cfg: DictConfig) -> dict[str, Any]:
    """Run the composed job; returns its results (also written to <job dir>/results.json)."""
    started = time.perf_counter()
    if (done := resume.skip_if_done(cfg)) is not None:  # a resumed sweep keeps the jobs already done
        return done
    job_dir, overrides, group = hydra_context()
    if cfg.distributed.nproc > 1:
        from . import distributed

        task = distributed.task_group()
        if task is not None and task[0] > 0:  # a Slurm task of a multi-process job, not its rank 0
            return distributed.run_secondary_task(OmegaConf.to_object(cfg), job_dir)
    res = results.empty(overrides, results.config_hash(cfg))
    measure.reset_cuda_peak()
    job: Config = OmegaConf.to_object(cfg)
    tags = [o.replace("=", ":") for o in overrides] or ["default"]
    run = wandb_log.start(job.logger, job_dir, group=group, name=",".join(overrides) or "default",
                          job_type="train", config=OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
                          tags=tags)
    config_error, autofit = None, None
    try:
        profile = hardware.detect(job.hardware)
        res["hardware"] = asdict(profile)
        if job.mode == Mode.estimate:  # no training, no weights, no GPU: predicted memory, FLOPs, time
            from . import estimate

            res["estimate"] = estimate.run_estimate(job, profile, job_dir)  # checks the rules but no-gpu
            res["shape_advice"] = res["estimate"]["shape_advice"]
            res["status"], res["reason"] = "ok", None
            return res
        rules.check(job, profile)
        if job.autofit or job.measure.estimate:
            from . import estimate

            if job.autofit:  # the largest micro-batch the estimator says fits; accumulation keeps batch_size
                job, autofit = estimate.autofit_job(job, profile)
            if job.measure.estimate:  # predicted before training, compared with the measured peak after
                res["estimate"] = estimate.for_job(job, profile)
        hardware.cap_memory(profile)
        if job.distributed.nproc > 1:  # torchrun starts the ranks; rank 0's results come back here
            from . import distributed

            distributed.run_ranks(job, job_dir, res)
        else:
            from .train_loop import train_and_evaluate

            train_and_evaluate(job, profile, job_dir, res, run)
        res["status"], res["reason"] = "ok", None
    except Exception as exc:  # noqa: BLE001 - every error is a result, not a lost sweep
        res["status"], res["reason"] = outcome(exc)
        if isinstance(exc, ConfigError):
            config_error = exc
        elif res["status"] == "failed":
            (job_dir / "traceback.txt").write_text(traceback.format_exc())
            traceback.print_exc()
    finally:
        if autofit is not None:
            res["effective"]["autofit"] = autofit
        res["time"]["total_s"] = round(time.perf_counter() - started, 3)
        res["memory"]["process_peak_rss"] = measure.process_peak_rss()
        res["memory"]["cuda_max_allocated"], res["memory"]["cuda_max_reserved"] = measure.cuda_peaks()
        results.write(job_dir / results.RESULTS_FILE, res)
        if run is not None:
            run.config.update({"effective": res["effective"]}, allow_val_change=True)
        wandb_log.finish(run, results.flatten({k: v for k, v in res.items() if k != "versions"}),
                         exit_code=0 if res["status"] != "failed" else 1)
        gc.collect()
        measure.reset_cuda_peak()
    print_summary(res, job_dir)
    if config_error is not None:
        print(f"memsweep: error: {config_error}")
        if not in_multirun():  # in a sweep it is this job's result; the sweep goes on and reports it
            raise SystemExit(2)
    return res


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def print_summary(res: dict[str, Any], job_dir: Path) -> None:
    m, t, mem = res["metrics"], res["time"], res["memory"]
    name = ",".join(res["overrides"]) or "default"
    lines = [f"[memsweep] {name}: {res['status']}" + (f" ({res['reason']})" if res["reason"] else "")]
    if res["status"] == "ok":
        lines.append(f"  F1 {m['f1']:.4f}  accuracy {m['accuracy']:.4f}  train loss {m['train_loss']:.4f}")
        at_peak = mem["peak_breakdown"] or {}
        lines.append(f"  peak {_mib(mem['peak_bytes'])} = " + " + ".join(
            f"{name} {_mib(at_peak.get(name, 0))}" for name in ("params", "grads", "optimizer", "activations", "temp"))
            + f" + other (step {mem['ledger_step']}, padded to {mem['ledger_seq_len']})")
        lines.append(f"  gradients {_mib(mem['grads_bytes'])}, held for backward {_mib(mem['activations_bytes'])}")
        predicted = results.estimate_vs_measured(res)
        if predicted["estimate_peak_bytes"]:
            error = predicted["estimate_error_pct"]
            lines.append(f"  predicted peak {_mib(predicted['estimate_peak_bytes'])} ({predicted['estimate_method']})"
                         + ("" if error is None else f", {error:+.1f} % vs measured"))
        lines.append(f"  train {t['train_s']:.1f} s, {t['samples_per_s']:.1f} samples/s, "
                     f"{t['tokens_per_s']:.0f} tokens/s; total {t['total_s']:.1f} s")
    lines += shapes.lines(res.get("shape_advice"))
    lines.append(f"  results: {job_dir / results.RESULTS_FILE}")
    print("\n".join(lines), flush=True)

