"""What a job shows while it runs: one progress display per phase, training (optimizer steps, the last
logged loss) and evaluation (batches), each with an ETA.

In a terminal it is a tqdm bar on stderr. Anywhere else (CI, a log file, Slurm) a bar's carriage
returns are noise, so it is a plain line at every tenth of the phase, or after a minute without one
(a slow phase still shows it is alive), and one when it ends. It replaces Trainer's own bars and log
dict printing (train_loop.build), which would say the same twice.
"""
import sys
import time

from transformers import TrainerCallback
from transformers.trainer_utils import has_length

from ..config.schema import Progress
from . import eta

LINE_EVERY = 0.1  # of a phase
LINE_AT_LEAST_EVERY_S = 60.0
# What each phase counts: as a line says it, and as tqdm's rate does (`6.10step/s`).
UNITS = {"train": ("steps", "step"), "eval": ("batches", "batch")}


def resolve(mode: Progress) -> Progress:
    """`auto`: a bar when stderr (where tqdm draws) is a terminal, else plain lines."""
    if mode != Progress.auto:
        return mode
    isatty = getattr(sys.stderr, "isatty", None)
    return Progress.bar if callable(isatty) and isatty() else Progress.lines


class Lines:
    """`[memsweep] train 40/100 steps, loss 0.512, 12.3 s elapsed, ETA 18.4 s`, a bounded number of times."""

    def __init__(self, name: str, total: int):
        self.name, self.total = name, total
        self.started = self.last_line = time.perf_counter()
        self.done, self.tenths_shown, self.loss = 0, 0, None

    def update(self, done: int, loss: float | None = None) -> None:
        self.done, self.loss = done, loss if loss is not None else self.loss
        if done >= self.total:  # close() says it
            return
        now = time.perf_counter()
        tenths = int(done / self.total / LINE_EVERY) if self.total else 0
        if tenths > self.tenths_shown or now - self.last_line >= LINE_AT_LEAST_EVERY_S:
            self.tenths_shown, self.last_line = tenths, now
            left = eta.remaining(done, self.total, now - self.started)
            self._print(f"{eta.duration(now - self.started)} elapsed"
                        + ("" if left is None else f", ETA {eta.duration(left)}"))

    def close(self, loss: float | None = None) -> None:
        self.loss = loss if loss is not None else self.loss
        self._print(f"done in {eta.duration(time.perf_counter() - self.started)}")

    def _print(self, timing: str) -> None:
        loss = "" if self.loss is None else f", loss {self.loss:.4g}"
        print(f"[memsweep] {self.name} {self.done}/{self.total} {UNITS[self.name][0]}{loss}, {timing}", flush=True)


class Bar:
    """A tqdm bar (its own rate and ETA), the last logged loss beside it."""

    def __init__(self, name: str, total: int):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=name, unit=UNITS[name][1], dynamic_ncols=True, file=sys.stderr)

    def update(self, done: int, loss: float | None = None) -> None:
        if loss is not None:
            self.bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
        self.bar.update(done - self.bar.n)

    def close(self, loss: float | None = None) -> None:
        if loss is not None:
            self.bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
        self.bar.close()


DISPLAYS = {Progress.bar: Bar, Progress.lines: Lines}


class PhaseProgress(TrainerCallback):
    """Trainer's events -> the phase's display, on the main process only (the other ranks train the
    same steps)."""

    def __init__(self, mode: Progress):
        self.mode = resolve(mode)
        self.phase = None
        self.loss: float | None = None
        self.evaluated: int | None = None  # batches of the running evaluation (Trainer reports each one)

    def _start(self, name: str, total: int) -> None:
        self.close()
        if self.mode in DISPLAYS:
            self.phase = DISPLAYS[self.mode](name, total)

    def close(self, loss: float | None = None) -> None:
        """End the current phase's display (also when the phase raised: the job's ending prints next)."""
        if self.phase is not None:
            self.phase.close(loss)
        self.phase, self.evaluated = None, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.loss = None
        if state.is_world_process_zero and not args.eval_on_start:  # else once that evaluation is done
            self._start("train", state.max_steps)

    def on_step_end(self, args, state, control, **kwargs):
        if self.phase is not None:
            self.phase.update(state.global_step, self.loss)

    def on_log(self, args, state, control, logs=None, **kwargs):
        # Read where Trainer logs anyway: reading the loss every step would sync the device every step.
        loss = (logs or {}).get("loss")
        if isinstance(loss, (int, float)):
            self.loss = float(loss)

    def on_train_end(self, args, state, control, **kwargs):
        if self.phase is not None:
            self.phase.update(state.global_step)
        mean = next((h["train_loss"] for h in reversed(state.log_history) if "train_loss" in h), None)
        self.close(mean if mean is not None else self.loss)

    def on_evaluation_begin(self, args, state, control, eval_dataloader=None, **kwargs):
        """Not a Trainer event: MemsweepTrainer sends it before the first batch."""
        if state.is_world_process_zero:
            self._start("eval", len(eval_dataloader) if has_length(eval_dataloader) else 0)
            self.evaluated = 0

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if not state.is_world_process_zero:
            return
        if self.evaluated is None:  # a Trainer that sent no begin: its first batch is the begin
            self.on_evaluation_begin(args, state, control, eval_dataloader)
        self.evaluated += 1
        if self.phase is not None:
            self.phase.update(self.evaluated)

    def on_predict(self, args, state, control, **kwargs):
        self.close()

    def on_evaluate(self, args, state, control, **kwargs):
        self.close()
        if args.eval_on_start and state.global_step == 0 and state.is_world_process_zero:  # training starts now
            self._start("train", state.max_steps)
