"""The ways a job ends: its statuses in results.json, the exception each ending other than `ok` is
raised as, and a single run's exit code."""
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager

# Every status a results.json may hold. `interrupted`: a person or the cluster stopped the job
# (stopping.py); `not started`: a launcher's worker was told to stop before it began this job.
STATUSES = ("ok", "oom", "unsupported", "diverged", "failed", "interrupted", "not started")
# The endings that are a measurement of the job: a resumed sweep keeps them. An error, a stop or a job
# never begun runs again.
KEPT_ON_RESUME = ("ok", "oom", "unsupported", "diverged")


class ConfigError(Exception):
    """Bad input (a path, a column, a value): the message names the key and what is allowed."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


def bad_input(key: str, allowed: str, exc: BaseException) -> ConfigError:
    """Any error met while checking `key`, as bad input about it: what went wrong and what is allowed."""
    text = " ".join(str(exc).split())[:300] or "no message"
    if isinstance(exc, KeyError):  # its message is only the key it did not find
        text = f"no such name: {text}"
    return ConfigError(key, f"{text} ({type(exc).__name__}); allowed: {allowed}")


@contextmanager
def naming(key: str, allowed: str) -> Iterator[None]:
    """Inside an input check, any error is bad input about `key`, whatever raised it (a JSON decoder, a
    codec, pandas, transformers...): one line, never a traceback."""
    try:
        yield
    except (ConfigError, Unsupported):
        raise
    except Exception as exc:  # noqa: BLE001 - the point: no traceback for bad input
        raise bad_input(key, allowed, exc) from None


class Unsupported(Exception):
    """A combination that cannot run here; `rules.py` raises it before any work is done."""


class Diverged(Exception):
    """The training loss became NaN or inf."""


class Interrupted(Exception):
    """SIGINT (Ctrl-C), SIGTERM, or the cluster's time-limit/preemption signal stopped the job. The
    message starts with the signal's name, then says where the job was and what it had measured."""

    def __init__(self, signum: int, detail: str):
        super().__init__(f"{signal.Signals(signum).name} {detail}")
        self.signum = signum


def interrupted(reason: str) -> Interrupted:
    """The Interrupted a recorded reason (a rank's error.json) came from, so it maps to the same ending."""
    found = re.search(r"\bSIG[A-Z0-9]+\b", reason)
    if found is None or found.group() not in signal.Signals.__members__:
        return Interrupted(signal.SIGINT, f"({reason})")
    before, after = reason[:found.start()].strip(" :"), reason[found.end():].strip()
    return Interrupted(signal.Signals[found.group()], f"{after} ({before})" if before else after)


def is_oom(exc: BaseException) -> bool:
    """An allocation that failed: torch's own error on a GPU, MemoryError or the CPU allocator's message."""
    import torch

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
    if isinstance(exc, Interrupted):
        return "interrupted", str(exc)
    if isinstance(exc, ConfigError):
        return "failed", f"{BAD_INPUT}{exc}"
    if is_oom(exc):
        return "oom", f"{type(exc).__name__}: {str(exc)[:300]}"
    return "failed", f"{type(exc).__name__}: {str(exc)[:500]}"


# A single run's exit code by how it ended, so scripts can tell the endings apart. A sweep exits 0
# when every job has a result (these statuses included) and 1 when a job failed, left none, or was
# stopped without the sweep itself being signalled.
EXIT_CODES = {"ok": 0, "failed": 1, "bad input": 2, "oom": 3, "diverged": 4, "unsupported": 5}
BAD_INPUT = "bad input: "


def stopped_exit_code(signum: int) -> int:
    """A job or sweep stopped by a signal exits 128 + its number, as a shell reports a process that
    signal ended: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(signum)


def exit_code(status: str, reason: str | None) -> int:
    if status == "failed" and (reason or "").startswith(BAD_INPUT):
        return EXIT_CODES["bad input"]
    if status == "interrupted":
        return stopped_exit_code(interrupted(reason or "").signum)
    return EXIT_CODES[status]


# The exception a status read back from a file (a rank's error.json) is raised as, so that
# `outcome` maps it to the same status again.
STATUS_EXCEPTIONS = {"oom": MemoryError, "diverged": Diverged, "unsupported": Unsupported,
                     "interrupted": interrupted}
