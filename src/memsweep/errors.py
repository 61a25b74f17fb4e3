"""The expected ways a job ends other than `ok`, and the status each exception maps to in results.json."""
from contextlib import contextmanager
from typing import Iterator


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
    if isinstance(exc, ConfigError):
        return "failed", f"{BAD_INPUT}{exc}"
    if is_oom(exc):
        return "oom", f"{type(exc).__name__}: {str(exc)[:300]}"
    return "failed", f"{type(exc).__name__}: {str(exc)[:500]}"


# A single run's exit code by how it ended, so scripts can tell the endings apart. A sweep exits 0
# when every job has a result (these statuses included) and 1 when a job failed or left none.
EXIT_CODES = {"ok": 0, "failed": 1, "bad input": 2, "oom": 3, "diverged": 4, "unsupported": 5}
BAD_INPUT = "bad input: "


def exit_code(status: str, reason: str | None) -> int:
    if status == "failed" and (reason or "").startswith(BAD_INPUT):
        return EXIT_CODES["bad input"]
    return EXIT_CODES[status]


# The exception a status read back from a file (a rank's error.json) is raised as, so that
# `outcome` maps it to the same status again.
STATUS_EXCEPTIONS = {"oom": MemoryError, "diverged": Diverged, "unsupported": Unsupported}
