"""What a person reads on the console while a job runs: memsweep's lines, Hydra's and the sweeper's, and
any library error, each line once. Everything else the libraries say goes to a log:

- a job (`python train.py`, in every mode: train, estimate, plan): Hydra's job log,
  `<job dir>/<job name>.log` (train.log), the file of the root logger's FileHandler;
- `python -m memsweep.app.estimate`: `<out>/estimate.log`;
- neither (`hydra/job_logging=none` leaves the root without a file): dropped.

It speaks of the library's own code (a deprecated name, an optional kernel it could not load), not of the
job's input, which memsweep checks and reports itself. Libraries speak three ways, each routed here:

- logging: a record of another package's logger below ERROR is kept off the console handlers (ConsoleFilter);
  a library's own console handler (transformers', torch's) is removed, so its records reach the root's;
- warnings, of any category: captured into logging (`py.warnings`), so to the log only;
- while being imported, before any routing can reach them: torch attaches a console handler of its own
  that does not propagate (torchao's import warns through it: `_pytree` deprecations), torchao and
  bitsandbytes log "Failed to load ..." through logging's last resort when the root has no handler,
  transformers prints with print, and C code may write to fd 2 itself. `quiet_libraries` imports them with
  fd 1 and 2 on the log, then reroutes what they attached. An import that fails still raises: its traceback
  reaches the console. A plan's worker processes send all their fd 1 and 2 there (worker_output_to).
"""
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The packages whose records are meant for the person running the job (submitit's: a job started, requeued).
SHOWN = ("memsweep", "hydra", "hydra_plugins", "optuna", "submitit", "__main__")
# The libraries that speak while they load (see the module); every job and estimate imports them anyway.
# transformers loads its parts lazily: the Trainer's (integration_utils prints a line when WANDB_MODE=offline).
LIBRARIES = ("torch", "torchao", "bitsandbytes", "peft", "transformers.trainer")
FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's job log format


class ConsoleFilter(logging.Filter):
    """On a console handler: library warnings off, and no line twice."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR and record.name.split(".")[0] not in SHOWN:
            return False
        line = (record.levelno, record.getMessage())
        if line in self.seen:
            return False
        self.seen.add(line)
        return True


def _is_console(handler: logging.Handler) -> bool:
    # exactly a StreamHandler: a FileHandler is the job log, a test runner's capture handler is its own
    return type(handler) is logging.StreamHandler


def root_log_file() -> Path | None:
    """The file the root logger writes (the job log, estimate.log); None where there is none."""
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    return Path(files[0].baseFilename) if files else None


def library_noise_to_log(log_file: Path | None = None) -> None:
    """Send library warnings to the log, not the console; `log_file`: a root logger no one configured (the
    estimate CLI's) gets that file and a filtered console. Safe to call again: a library imported since
    (whose logger writes to the console itself, as transformers' and torch's do) is rerouted then."""
    logging.captureWarnings(True)
    root = logging.getLogger()
    if log_file is not None and not any(isinstance(h, logging.FileHandler) for h in root.handlers):
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        if not any(_is_console(h) for h in root.handlers):  # a library's error, and memsweep's records, shown
            root.addHandler(logging.StreamHandler())
    if not root.handlers:  # else logging's last resort prints every warning on stderr
        root.addHandler(logging.NullHandler())
    for handler in root.handlers:
        if _is_console(handler) and not any(isinstance(f, ConsoleFilter) for f in handler.filters):
            handler.addFilter(ConsoleFilter())
    from transformers.utils import logging as transformers_logging  # the checks import it: reroute it first

    transformers_logging.disable_default_handler()
    transformers_logging.enable_propagation()
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger) or name.split(".")[0] in SHOWN:
            continue
        own = [h for h in logger.handlers if _is_console(h)]
        for handler in own:  # its records now reach the root's handlers: the log, and the filtered console
            logger.removeHandler(handler)
        if own:
            logger.propagate = True


def _point_output_at(path: Path | None) -> None:
    """This process's fd 1 and 2 append to `path` (None: os.devnull) from here on."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    target = os.open(path or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for fd in (1, 2):
        os.dup2(target, fd)
    os.close(target)


@contextmanager
def output_to(path: Path | None) -> Iterator[None]:
    """Inside, this process's fd 1 and 2 append to `path` (None: os.devnull): what C code, print or a
    handler holding sys.stderr writes. Restored on the way out, an exception included."""
    saved = [os.dup(1), os.dup(2)]
    try:
        _point_output_at(path)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def worker_output_to(path: Path | None) -> None:
    """A worker process whose results and lines its parent prints (planner/parallel.py): all it writes to
    fd 1 and 2 from now on (warnings, logging's last resort, torch's handler, C code), which is the libraries'
    alone, appends to `path` (the parent's root_log_file). An error still reaches the parent, which raises it."""
    _point_output_at(path)


def quiet_libraries(log_file: Path | None = None) -> None:
    """Route library output (library_noise_to_log), import the LIBRARIES with what they print while loading
    going to the log, then reroute the console handlers they attached. Call it before the first heavy import."""
    library_noise_to_log(log_file)
    with output_to(root_log_file()):
        for name in LIBRARIES:
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
    library_noise_to_log()
