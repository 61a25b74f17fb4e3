"""Build the job from its setup, train it with Trainer, evaluate it, and fill in the results."""
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PrinterCallback, ProgressCallback, TrainingArguments
from transformers.utils import logging as hf_logging

from ..config.schema import Config, HardwareConf, Progress
from ..errors import Diverged
from ..measure import host_memory, memcap, progress, shapes
from ..measure.ledger import LedgerCallback, effective, param_bytes
from ..measure.steptime import StepTimer
from ..techniques import offload, optim, quantize
from . import data as data_mod
from . import ds_ops, images, procenv, stopping, task
from . import model as model_mod
from .results import Result
from .setup import Setup, build_setup
from .trainer import BeforeTraining, DivergenceCallback, MemsweepTrainer, StopCallback, WandbLogCallback


def optimizer_steps(n_train: int, micro_batch: int, accumulation: int, world_size: int, epochs: float,
                    max_steps: int) -> int:
    """Optimizer steps Trainer will take (its own arithmetic: a last partial accumulation counts)."""
    if max_steps > 0:
        return max_steps
    batches = math.ceil(n_train / (micro_batch * world_size))
    per_epoch = max(1, math.ceil(batches / accumulation))
    return max(1, math.ceil(per_epoch * epochs))


def training_arguments(job: Config, setup: Setup, out_dir: Path) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out_dir),
        report_to="none",  # memsweep logs to W&B itself, one run per job
        save_strategy="no",
        eval_strategy="no",
        eval_on_start=task.evaluates_before(job.task),  # the quality before training (task.py)
        logging_strategy="steps",
        logging_steps=10,
        logging_nan_inf_filter=False,  # a NaN loss must show, so the job is stopped as diverged
        num_train_epochs=job.epochs,
        max_steps=job.max_steps,
        per_device_eval_batch_size=job.eval_batch_size,
        seed=job.seed,
        data_seed=job.seed,
        use_cpu=setup.device == "cpu",
        # images have no tokens to count (the samples are counted)
        include_num_input_tokens_seen="no" if task.images(job.task) else "non_padding",
        # Every trainable parameter takes part in the forward; DDP's search for unused ones costs a
        # graph traversal per step (ignored without DDP).
        ddp_find_unused_parameters=False,
        ddp_backend=None if job.distributed.backend == "auto" else job.distributed.backend,
        **setup.args,
    )


@dataclass
class Built:
    """A built job: the trainer and what measures it."""
    trainer: MemsweepTrainer
    data: "data_mod.TextData | images.ImageData"
    ledger: LedgerCallback
    divergence: DivergenceCallback
    before: BeforeTraining
    step_timer: StepTimer
    progress: progress.PhaseProgress


def load_data(job: Config):
    """(tokenizer, data): tokenised text, or images at the model's input size (no tokenizer)."""
    if task.images(job.task):
        return None, images.load(job.data, job.seed, model_mod.hf_config(job.model)[0])
    tokenizer = model_mod.load_tokenizer(job.model)
    return tokenizer, data_mod.load(job.data, job.seed, tokenizer, job.max_seq_len, labelled=task.labelled(job.task))


def first_step_after_warmup(job: Config, steps: int) -> int:
    """The optimizer step (1-based) the memory ledger is taken on, padded to max_seq_len: after the warm-up."""
    return min(job.measure.warmup_steps + 1, steps)


def build(job: Config, profile: HardwareConf, job_dir: Path, run=None) -> Built:
    """Tokenizer, data, model with every technique applied, and the Trainer that will run it."""
    procenv.prepare()
    hf_logging.set_verbosity_error()
    display = progress.PhaseProgress(job.progress)
    if display.mode != Progress.bar:  # in a log, transformers' loading bars are carriage-return noise
        hf_logging.disable_progress_bar()
    procenv.use_threads(job.threads)
    if job.malloc_reuse:
        host_memory.keep_freed_memory()
    torch.manual_seed(job.seed)
    setup = build_setup(job, profile)
    if setup.process_group:
        procenv.enter_group_of_one()  # left again by release(), also when building fails
    ds_ops.load(setup.techniques)  # DeepSpeed's ops, built here on their first use (one line says so)

    tokenizer, data = load_data(job)
    model = setup.transform(model_mod.load_model(job.model, task.num_labels(job.task, data.label_names),
                                                setup.load_kwargs, task.auto_class(job.task), tokenizer))

    steps = optimizer_steps(len(data.train), setup.micro_batch_size, setup.accumulation_steps,
                            setup.world_size, job.epochs, job.max_steps)
    ledger_step = first_step_after_warmup(job, steps)
    # the tokens each example is: max_seq_len (the measured step is padded to it), or an image's patches
    seq_len = images.tokens(model.config) if task.images(job.task) else job.max_seq_len
    ledger = LedgerCallback(step=ledger_step, seq_len=seq_len, enabled=job.measure.ledger)
    divergence, before = DivergenceCallback(), BeforeTraining()
    # The ledger step is padded to max_seq_len and traced: not a representative step time.
    step_timer = StepTimer(skip_steps=(ledger_step,) if job.measure.ledger else ())
    trainer = MemsweepTrainer(
        model=model,
        args=training_arguments(job, setup, job_dir / "trainer"),
        train_dataset=data.train,
        eval_dataset=data.eval if task.evaluates_before(job.task) else None,
        processing_class=tokenizer,
        data_collator=task.collator(job.task, tokenizer, job.data.pad_to_multiple_of),
        callbacks=[ledger, divergence, before, StopCallback(), WandbLogCallback(run), step_timer, display],
        setup=setup,
        pad_to=job.max_seq_len,
        pad_measured_step=ledger_step if job.measure.ledger else -1,
    )
    for stock in (PrinterCallback, ProgressCallback):  # `display` replaces them: both would say the same
        trainer.remove_callback(stock)
    return Built(trainer, data, ledger, divergence, before, step_timer, display)


def train_and_evaluate(job: Config, profile: HardwareConf, job_dir: Path, res: Result, run) -> None:
    built = None
    setup_started = time.perf_counter()
    procenv.settle_imports()
    try:
        with stopping.interruptible("while loading the tokenizer, data and model"):
            built = build(job, profile, job_dir, run)
        res.shape_advice = shapes.audit(profile, built.trainer.setup.micro_batch_size,
                                           getattr(built.trainer.model.config, "vocab_size", None),
                                        job.data.pad_to_multiple_of, images=task.images(job.task))
        model, setup = built.trainer.model, built.trainer.setup
        if setup.techniques.lora.quantize:  # what the base holds, quantized and not (techniques/quantize.py)
            res.effective["quantization"] = asdict(quantize.audit(model, setup.structure.layers))
        held = param_bytes(model) + sum(b.numel() * b.element_size() for b in model.buffers())
        with memcap.cap_for(profile, held_bytes=held):  # hardware.memory_gib on a CPU profile: a real OOM
            _train_and_evaluate(built, job, profile, res, run, setup_started)
    finally:
        release(built)


def _train_and_evaluate(built: Built, job: Config, profile: HardwareConf, res: Result, run,
                        setup_started: float) -> None:
    trainer, data = built.trainer, built.data
    res.data.update(asdict(data.rows), train_examples=len(data.train), eval_examples=len(data.eval),
                    labels=data.label_names)
    if (left_out := data.rows.summary()) is not None:  # no row is left out silently (run/data.py)
        print(left_out, flush=True)
    # One process: a stop ends training after the optimizer step in progress (StopCallback). The ranks
    # of a multi-process job must not stop at different steps (the others would wait in a collective
    # forever): there a signal interrupts the step at once and torchrun ends the other ranks.
    stops_between_steps = trainer.args.world_size == 1
    with optim.own_bitsandbytes_overrides(), (
            stopping.deferred() if stops_between_steps else stopping.interruptible("during training")):
        out = trainer.train()
    if built.divergence.diverged_at is not None:
        raise Diverged(f"loss became NaN/inf by optimizer step {built.divergence.diverged_at}")
    if not math.isfinite(out.training_loss):  # a NaN after the last logged step
        raise Diverged(f"mean training loss is {out.training_loss}")
    record_training(built, out, profile, res)
    res.time.update(built.step_timer.summary(setup_started))
    if stopping.requested() is not None:  # stopped between two optimizer steps: what it measured is kept
        res.effective.update(effective(trainer.model, trainer, measured_ledger(built)))
        stopping.stop_if_requested(stopped_at(trainer, res))

    started = time.perf_counter()
    with stopping.interruptible("during evaluation, after training "
                                f"{trainer.state.global_step} optimizer steps (train loss {out.training_loss:.4f})"):
        res.metrics.update(**task.evaluate(job.task, trainer, data.eval))
    res.time.eval_s = round(time.perf_counter() - started, 3)
    # beside what the job recorded itself (autofit)
    res.effective.update(effective(trainer.model, trainer, measured_ledger(built)))
    if run is not None:
        run.log({f"eval/{k}": getattr(res.metrics, k) for k in ("f1", "accuracy", "eval_loss", "perplexity")
                 if getattr(res.metrics, k) is not None})


def record_training(built: Built, out, profile: HardwareConf, res: Result) -> None:
    """What training measured: loss, time, throughput, tokens, and the memory ledger of its step."""
    trainer = built.trainer
    runtime, before = out.metrics["train_runtime"], built.before.metrics
    if before:  # Trainer's train time includes the evaluation before the first step
        res.metrics.update(task.before_metrics(float(before["eval_loss"])))
        res.time.update(eval_before_s=round(before["eval_runtime"], 3))
    train_s = runtime - (res.time.eval_before_s or 0.0)
    tokens = trainer.tokens_seen()
    res.data.train_tokens_seen = tokens  # non-padding: which examples were trained on, in total
    res.metrics.train_loss = float(out.training_loss)
    res.time.update(train_s=round(train_s, 3),
                    samples_per_s=round(out.metrics["train_samples_per_second"] * runtime / train_s, 3),
                    tokens_per_s=round(tokens / train_s, 1) if train_s else None,
                    optimizer_steps=trainer.state.global_step)
    ledger = measured_ledger(built)
    mem = res.memory
    mem.device = profile.device
    if ledger is not None:
        b = ledger.breakdown
        mem.update(peak_bytes=ledger.peak_bytes, params_bytes=b.get("params", 0), grads_bytes=ledger.grads_bytes,
                   optimizer_bytes=ledger.optimizer_bytes, activations_bytes=ledger.activations_bytes,
                   buffers_bytes=b.get("buffers", 0), temp_bytes=b.get("temp", 0), other_bytes=b.get("other", 0),
                   peak_breakdown=b, ledger_step=ledger.step, ledger_seq_len=ledger.seq_len)
    else:
        mem.params_bytes = param_bytes(trainer.model)


def measured_ledger(built: Built):
    """The memory ledger of the measured step, or None (not taken, or training ended before it)."""
    ledger = built.ledger.ledger
    return ledger if ledger and ledger.peak_bytes else None


def stopped_at(trainer: MemsweepTrainer, res: Result) -> str:
    """Where training stopped and what it had measured, for the reason of an interrupted job."""
    ledger = (f"memory ledger of step {res.memory.ledger_step}: peak {res.memory.peak_bytes / 2**20:,.0f} MiB"
              if res.memory.peak_bytes else "no memory ledger taken yet")
    state = trainer.state
    return (f"at optimizer step {state.global_step} of {state.max_steps}, after {res.time.train_s:.1f} s of "
            f"training (train loss {res.metrics.train_loss:.4f}, {ledger}); not evaluated")


def release(built: Built | None) -> None:
    """Leave the process clean for the next job of a sweep (Hydra's basic launcher runs them all in one)."""
    if built is not None:
        built.progress.close()  # a phase that raised leaves its bar open
        built.ledger.close()  # a job that raised inside the ledger step leaves its tracker open
        offload.release(built.trainer.model)
        built.trainer.accelerator.free_memory()
        if built.trainer.args.torch_compile:
            # dynamo's caches outlive the job: a later compiled job of the process would capture nothing
            torch._dynamo.reset()
    procenv.teardown()
