"""What a person reads on the console while a job runs: memsweep's lines, Hydra's and the sweeper's, and
any library error, each line once.

A library's warnings (a record of another package's logger below ERROR, and Python's warnings of any
category) go to the job log only (Hydra's `<job dir>/<job name>.log`; the estimate CLI's estimate.log):
they speak of the library's own code (a deprecated name, an optional kernel it could not load), not of
the job's input, which memsweep checks and reports itself.
"""
import logging
from pathlib import Path

# The packages whose records are meant for the person running the job (submitit's: a job started, requeued).
SHOWN = ("memsweep", "hydra", "hydra_plugins", "optuna", "submitit", "__main__")


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


def library_noise_to_log(log_file: Path | None = None) -> None:
    """Send library warnings to the log, not the console. Safe to call again: a library imported since
    (whose logger writes to the console itself, as transformers' does) is rerouted then."""
    logging.captureWarnings(True)
    root = logging.getLogger()
    if log_file is not None and not any(isinstance(h, logging.FileHandler) for h in root.handlers):
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
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
