"""One job, top to bottom: check -> build -> apply the techniques -> train -> evaluate -> results.json.

Every ending is a result: `ok`, `unsupported` (a rule refused it), `oom`, `diverged`, `interrupted`
(SIGINT, SIGTERM or the cluster's signal stopped it: stopping.py) or `failed` (any other error,
traceback in the job log). `finishing` always writes results.json, finishes the W&B run and frees
memory, so a sweep loses nothing and goes on to its next job (or, stopped, keeps what it has).

Bad input is refused in seconds: this module imports torch, transformers and the rest only once the
input has passed `validate`.
"""
import gc
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..config import validate
from ..config.schema import Config, Mode
from ..errors import BAD_INPUT, EXIT_CODES, ConfigError, exit_code, outcome
from ..measure import counters, shapes
from ..run import inputs, results, stopping, task, validate_model
from ..run.results import Memory, Result
from ..sweep import resume, sweepdir, wandb_log


@dataclass
class Context:
    """Where Hydra put this job: its dir, its overrides, and whether it is one job of a sweep."""
    job_dir: Path
    overrides: list[str]
    wandb_group: str
    multirun: bool

    @property
    def name(self) -> str:
        return sweepdir.job_name(self.overrides)


def hydra_context() -> Context:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    root = hc.sweep.dir if multirun else hc.run.dir
    overrides = OmegaConf.to_container(hc.overrides.task, resolve=False)  # as typed: `lr=${optim.lr}` stays text
    return Context(Path(hc.runtime.output_dir), overrides, sweepdir.wandb_group(str(root)), multirun)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Run the composed job; returns its results (also written to <job dir>/results.json)."""
    with stopping.handling():  # SIGINT/SIGTERM end the job `interrupted` (stopping.py)
        if (signum := stopping.requested()) is not None:  # a launcher's worker, stopped before this job
            return not_started(cfg, signum)
        if (done := resume.skip_if_done(cfg)) is not None:  # a resumed sweep keeps the jobs already done
            return done
        ctx = hydra_context()
        if cfg.distributed.nodes * cfg.distributed.nproc > 1:
            from ..run import launch

            if launch.is_secondary_task():  # a Slurm task of a multi-process job, not its rank 0
                return launch.run_secondary_task(OmegaConf.to_object(cfg), ctx.job_dir)
        res = Result.start(ctx.overrides, results.config_hash(cfg), ctx.wandb_group)
        with finishing(res, ctx, cfg) as wandb_run, stopping.interruptible("while setting the job up"):
            body(cfg, res, ctx.job_dir, wandb_run)
        # an estimate printed its own advice
        print_summary(res, ctx.job_dir, advice=cfg.mode == Mode.train, images=task.images(cfg.task))
        if (run_at := wandb_log.where(wandb_run)) is not None:  # wandb's own block is off (wandb_log)
            print(f"[memsweep] W&B run: {run_at}", flush=True)
        stopping.hand_over()  # stopped by the cluster's signal: submitit requeues the job
    code = exit_code(res.status, res.reason)
    if code == EXIT_CODES["bad input"]:
        print(f"memsweep: error: {res.reason.removeprefix(BAD_INPUT)}")
    if code and not ctx.multirun:  # in a sweep it is this job's result; the sweep goes on and reports it
        raise SystemExit(code)
    return res.to_dict()


def not_started(cfg: DictConfig, signum: int) -> dict[str, Any]:
    """The job a launcher's worker is handed after its sweep was told to stop: recorded as not started
    (resume runs it), unless an earlier attempt left a result there (resume decides about that one)."""
    ctx = hydra_context()
    res = Result.start(ctx.overrides, results.config_hash(cfg), ctx.wandb_group)
    res.end("not started", f"the sweep was stopped ({stopping.name(signum)}) before this job began")
    print(f"[memsweep] {ctx.name}: not started ({res.reason})", flush=True)
    path = ctx.job_dir / results.RESULTS_FILE
    if results.read(path) is None:
        results.write(path, res.to_dict())
    return res.to_dict()


def checked(cfg: DictConfig, res: Result) -> Config:
    """The job's input, refused (ConfigError) before any work, in every mode; a pretrained model's changed shape
    said and recorded, never silent."""
    from ..run import console

    job: Config = validate.settings(cfg)
    res.lr_source = lr_source(job, res.overrides)
    console.quiet_libraries()  # before the first heavy import: what the libraries say as they load, to the job log
    inputs.inputs(job)
    if (change := validate_model.shape_change(job)) is not None and change.alters:
        res.effective["pretrained_shape"] = change.record()
        print(change.line(), flush=True)
    if job.mode == Mode.plan:
        from ..planner import space

        space.check_plan_keys(job)  # what the plan's lists name, with the job's other keys
    return job


def body(cfg: DictConfig, res: Result, job_dir: Path, wandb_run) -> None:
    """What the job does, in order; any exception is its ending (see finishing)."""
    job = checked(cfg, res)
    from ..config import hardware
    from ..run import launch, procenv
    from ..techniques import rules

    procenv.prepare()
    procenv.use_allocator(job)  # expandable_segments: in the environment before CUDA starts (and the ranks')
    profile = hardware.detect(job.hardware)
    res.hardware = asdict(profile)
    if job.mode == Mode.plan:  # the fastest combination that fits each GPU: no training, no weights, no GPU
        from .plan import run_plan

        with stopping.interruptible("during the plan"):
            res.effective["plan"] = run_plan(job, job_dir)
        return
    if job.mode == Mode.estimate:  # no training, no weights, no GPU: predicted memory, FLOPs, time
        from ..estimate.core import run_estimate

        with stopping.interruptible("during the estimate"):
            res.estimate = run_estimate(job, profile, job_dir)  # checks the rules but no-gpu
        res.shape_advice = res.estimate["shape_advice"]
        return
    rules.refuse_unsupported(job, profile)
    warn_if_emulated(job, profile, res)
    if job.autofit:  # the largest micro-batch the estimator says fits; accumulation keeps batch_size
        from ..estimate.autofit import autofit_job

        job, res.effective["autofit"] = autofit_job(job, profile)
    procenv.use_threads(job.threads)  # the estimate times the step at the thread count the job trains with
    if job.measure.estimate:  # predicted before training, compared with the measured peak after
        from ..estimate.core import estimate_beside_training

        res.estimate = estimate_beside_training(job, profile)
        if res.estimate.get("predicted_step_s"):  # the step the data mostly makes, beside the longest
            from ..estimate.core import typical_step

            res.estimate["at_data"] = typical_step(job, profile)
    hardware.cap_memory(profile)
    if launch.spans_processes(job):  # torchrun or Slurm starts the ranks; global rank 0's results come back here
        launch.run_ranks(job, job_dir, res)
    else:
        from ..run.train_loop import train_and_evaluate

        train_and_evaluate(job, profile, job_dir, res, wandb_run)


def lr_source(job: Config, overrides: list[str]) -> str:
    """Where the job's learning rate came from: an override, a preset's stated source, or the optimizer."""
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key in ("lr", "optim.lr"):
            return f"{key}={value} (override)"
    return str(job.tags.get("lr_source") or f"optim={job.optim.name}'s own default (conf/optim/{job.optim.name}.yaml)")


def warn_if_emulated(job: Config, profile, res: Result) -> None:
    """A precision the device only emulates trains correctly but far slower: say so once, and record it."""
    from ..techniques import precision

    res.effective["emulated_precision"] = dtype = precision.emulated(job.precision.name, profile)
    if dtype is not None:
        print(f"[memsweep] warning: {dtype} is emulated on {profile.name} (no native {dtype} matmuls): the job runs "
              "correctly, but its time is not representative of hardware that has them", flush=True)


@contextmanager
def finishing(res: Result, ctx: Context, cfg: DictConfig) -> Iterator[Any]:
    """Start the job's W&B run; whatever happens inside, end with a status, results.json written,
    the W&B run finished and memory freed. Exceptions become the result, never a lost sweep."""
    started = time.perf_counter()
    ctx.job_dir.mkdir(parents=True, exist_ok=True)  # Hydra makes it; a job called another way may not have it
    counters.reset_cuda_peak()
    logger = OmegaConf.to_object(cfg.logger)
    # every job is a W&B run of its sweep's group, a refused one too: its run records why (status, reason)
    wandb_run = wandb_log.start(logger, ctx.job_dir, group=ctx.wandb_group, name=ctx.name, job_type="train",
                                config=results.container(cfg),
                                tags=[o.replace("=", ":") for o in ctx.overrides] or ["default"])
    try:
        yield wandb_run
        res.end("ok", None)
    except Exception as exc:  # noqa: BLE001 - every error is a result, not a lost sweep
        res.end(*outcome(exc))
        if res.status == "failed" and not isinstance(exc, ConfigError):
            (ctx.job_dir / "traceback.txt").write_text(traceback.format_exc())
            traceback.print_exc()
    finally:
        res.time.total_s = round(time.perf_counter() - started, 3)
        res.memory.process_peak_rss = counters.process_peak_rss()
        res.memory.cuda_max_allocated, res.memory.cuda_max_reserved = counters.cuda_peaks()
        res.memory.device_used_bytes, res.memory.cuda_context_bytes = counters.device_used_peak()
        saved = res.to_dict()
        results.write(ctx.job_dir / results.RESULTS_FILE, saved)
        if wandb_run is not None:
            wandb_run.config.update({"effective": res.effective}, allow_val_change=True)
        wandb_log.finish(wandb_run, results.flatten({k: v for k, v in saved.items() if k != "versions"}),
                         exit_code=wandb_exit_code(res))
        gc.collect()
        counters.reset_cuda_peak()


def wandb_exit_code(res: Result) -> int:
    """What the W&B run records as its exit: an error 1, a stop the signal's exit code (130, 143), else 0:
    oom, diverged and unsupported are results of a run that worked."""
    if res.status == "interrupted":
        return exit_code(res.status, res.reason)
    return 1 if res.status == "failed" else 0


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def _batch(micro_batch: int | None, mem: Memory, images: bool) -> str:
    """The measured step's shape: its micro-batch in images, or x the tokens it was padded to."""
    return f"micro-batch {micro_batch} images" if images else f"micro-batch {micro_batch} x {mem.ledger_seq_len} tokens"


def print_summary(res: Result, job_dir: Path, advice: bool = True, images: bool = False) -> None:
    """The job's lines: its ending, what it measured and for which shape (`images`: an image task's, counted in
    images, not tokens), and (`advice`) the tensor-core advice."""
    m, t, mem = res.metrics, res.time, res.memory
    name = sweepdir.job_name(res.overrides)
    lines = [f"[memsweep] {name}: {res.status}" + (f" ({res.reason})" if res.reason else "")]
    if res.status == "ok" and m.train_loss is not None:  # trained (mode=estimate prints its own line)
        lines.append(f"  F1 {m.f1:.4f}  accuracy {m.accuracy:.4f}  train loss {m.train_loss:.4f}" if m.f1 is not None
                     else f"  perplexity {m.perplexity:.2f}" + (f" (before training {m.perplexity_before:.2f})"
                                                                if m.perplexity_before is not None else "")
                     + f"  eval loss {m.eval_loss:.4f}  train loss {m.train_loss:.4f}")
        at_peak = mem.peak_breakdown or {}
        lines.append(f"  peak {_mib(mem.peak_bytes)} = " + " + ".join(
            f"{part} {_mib(at_peak.get(part, 0))}" for part in ("params", "grads", "optimizer", "activations", "temp"))
            + f" + other (step {mem.ledger_step}, {_batch(res.effective.get('micro_batch_size'), mem, images)})")
        lines.append(f"  gradients {_mib(mem.grads_bytes)}, held for backward {_mib(mem.activations_bytes)}")
        predicted = results.estimate_vs_measured(res.to_dict())
        if predicted["estimate_peak_bytes"]:
            error = predicted["estimate_error_pct"]
            lines.append(f"  predicted peak {_mib(predicted['estimate_peak_bytes'])} ({predicted['estimate_method']})"
                         + ("" if error is None else f", {error:+.1f} % vs measured"))
        if predicted["step_time_error_pct"] is not None:
            tokens = predicted["predicted_step_tokens"]
            where = f" at the data's typical {tokens} tokens" if tokens else ""
            lines.append(f"  predicted step {1e3 * predicted['predicted_step_s']:.1f} ms{where}, measured median "
                         f"{1e3 * predicted['measured_step_s']:.1f} ms ({predicted['step_time_error_pct']:+.1f} %)")
        tokens = f"{t.tokens_per_s:.0f} tokens/s; " if t.tokens_per_s else ""  # images count no tokens
        lines.append(f"  train {t.train_s:.1f} s, {t.samples_per_s:.1f} samples/s, {tokens}total {t.total_s:.1f} s")
    lines += shapes.lines(res.shape_advice) if advice else []
    lines.append(f"  results: {job_dir / results.RESULTS_FILE}")
    print("\n".join(lines), flush=True)
