"""A stop asked for is an ending: SIGINT (Ctrl-C), SIGTERM (`kill`, Slurm's scancel and time limit) and,
inside a submitit job, its time-limit/preemption signal (USR2) end the running job `interrupted`.

Inside Trainer's loop the stop is recorded and training ends after the optimizer step in progress
(`deferred`); elsewhere in a job it raises `Interrupted` at once (`interruptible`); between a sweep's jobs it is
recorded and the sweep starts no further job. A second Ctrl-C ends the process at once; copies of the first
signal are ignored. On the cluster's signal the ended job hands over to submitit, which requeues it (`hand_over`).

How the handler works where Python cannot raise, and why copies are ignored: docs/guide/running.md.
"""
import _thread
import functools
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import Interrupted

# A second SIGINT sooner than this after the first is the same Ctrl-C, forwarded by a launcher.
SAME_CTRL_C_S = 1.0
# A stop swallowed where Python cannot raise is delivered again this much later (`_redeliver`).
REDELIVER_AFTER_S = 0.001


@dataclass
class _State:
    signum: int | None = None  # the stop asked for, once one is
    at: float = 0.0  # when (monotonic)
    where: str | None = None  # inside an `interruptible` block: raise, saying this
    previous: dict[int, Any] = field(default_factory=dict)  # the handlers ours replaced
    raised: Callable[[], Interrupted | None] | None = None  # what the handler raised last, and where
    raised_where: str | None = None
    redelivered: bool = False  # the next call of the handler is `_redeliver`'s, not a new signal
    in_hook: bool = False  # inside `_redeliver`
    unraisable_hook: Any = None  # sys.unraisablehook as it was before `install`


_state = _State()


def requested() -> int | None:
    """The signal that asked this process to stop, or None."""
    return _state.signum


def name(signum: int) -> str:
    return signal.Signals(signum).name


def cluster_signal() -> int | None:
    """submitit's time-limit/preemption signal (USR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise) when
    this process runs a submitit job, else None."""
    if "SUBMITIT_FOLDER" not in os.environ:  # set by submitit in every job it runs; saves importing it
        return None
    try:
        import submitit

        return submitit.JobEnvironment()._usr_sig()
    except (ImportError, RuntimeError):
        return None


def _handle(signum: int, frame) -> None:
    now = time.monotonic()
    if _state.redelivered:
        _state.redelivered = False
        if _state.in_hook:  # the hook has not ended yet: once more, later
            _deliver_later(signum)
        else:
            _raise_if_interruptible(signum)  # the block may have ended since: then nothing to do
        return
    if _state.signum is not None:
        if signum == signal.SIGINT and now - _state.at > SAME_CTRL_C_S:
            print("[memsweep] Ctrl-C again: ending at once", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        return
    _state.signum, _state.at = signum, now
    _raise_if_interruptible(signum)
    print(f"[memsweep] {name(signum)}: stopping at the next safe point (the end of the optimizer step in "
          "progress); no further job starts. Ctrl-C again ends at once", file=sys.stderr, flush=True)


def _raise_if_interruptible(signum: int) -> None:
    if _state.where is not None:
        where, _state.where = _state.where, None  # raised once; the job's ending is not interrupted
        raised = Interrupted(signum, where)
        _state.raised, _state.raised_where = weakref.ref(raised), where  # not kept alive: its frames hold the job's
        raise raised


def _redeliver(unraisable: Any) -> None:
    """sys.unraisablehook while installed: the handler's Interrupted, raised where Python could only
    print it (a `__del__`, a weakref callback, the garbage collector), is not lost: the block gets it
    again a moment later, at a bytecode of the main thread where it propagates. Anything else goes to
    the hook that was there before."""
    if _state.raised is None or unraisable.exc_value is not _state.raised():
        _state.unraisable_hook(unraisable)
        return
    _state.where, _state.raised = _state.raised_where, None
    _state.in_hook = True
    _deliver_later(unraisable.exc_value.signum)
    _state.in_hook = False  # no bytecode after this one runs a handler: the hook has ended


def _deliver_later(signum: int) -> None:
    _state.redelivered = True
    threading.Thread(target=_interrupt_main, args=(signum,), daemon=True).start()


def _interrupt_main(signum: int) -> None:
    # from this thread, after a pause: in the hook's own thread the handler would run inside the hook
    time.sleep(REDELIVER_AFTER_S)
    if _state.redelivered and signal.getsignal(signum) is _handle:  # not once the handlers are gone
        _thread.interrupt_main(signum)


def install() -> bool:
    """Handle SIGINT, SIGTERM and the cluster's signal from now on, with no stop asked for yet. False
    when nothing was installed: already installed, or not the main thread (only it can have handlers).
    SIGINT stays ignored where it was (a background job: the shell asked that Ctrl-C not reach it)."""
    if _state.previous or threading.current_thread() is not threading.main_thread():
        return False
    _state.signum, _state.where = None, None
    wanted = [signal.SIGTERM, cluster_signal()]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        wanted.append(signal.SIGINT)
    for signum in filter(None, wanted):
        _state.previous[signum] = signal.signal(signum, _handle)
    _state.unraisable_hook, sys.unraisablehook = sys.unraisablehook, _redeliver
    return True


def uninstall() -> None:
    """The handlers as they were before `install`, and no stop asked for."""
    for signum, handler in _state.previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    _state.previous.clear()
    if sys.unraisablehook is _redeliver:
        sys.unraisablehook = _state.unraisable_hook
    _state.signum, _state.where, _state.raised, _state.redelivered = None, None, None, False


@contextmanager
def handling() -> Iterator[None]:
    """Stops handled inside the block; left as they are when the block began with them already handled
    (a sweep installs them for all its jobs: app/callbacks.py)."""
    installed_here = install()
    try:
        yield
    finally:
        if installed_here:
            uninstall()


def stop_if_requested(where: str) -> None:
    """Raise Interrupted if a stop was asked for (`where`: what the job was doing)."""
    if _state.signum is not None:
        raise Interrupted(_state.signum, where)


@contextmanager
def _mode(where: str | None) -> Iterator[None]:
    stop_if_requested(where or "before training")
    outer, _state.where = _state.where, where
    try:
        yield
    finally:
        _state.where = outer if _state.signum is None else None


def interruptible(where: str) -> Any:
    """A block a signal interrupts at once: it raises Interrupted(signal, `where`)."""
    return _mode(where)


def deferred() -> Any:
    """A block a signal only marks (Trainer's loop): the code inside stops at its next safe point."""
    return _mode(None)


def hand_over() -> None:
    """After a job stopped by the cluster's signal: submitit's own handler checkpoints (the launcher's
    `checkpoint()` -> a DelayedSubmission of the same job) and requeues it, then exits. A job it will
    not requeue (timed out too often, or not checkpointable) just ends."""
    signum = _state.signum
    handler: Callable | None = _state.previous.get(signum) if signum is not None else None
    if signum is None or signum != cluster_signal() or not callable(handler):
        return
    from submitit.core.utils import UncompletedJobError

    try:
        handler(signum, None)
    except UncompletedJobError as exc:
        print(f"[memsweep] not requeued: {exc}", flush=True)


def _worker_ignores_stops(init: Callable | None, worker_id: int) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    if init is not None:
        init(worker_id)


def leave_stops_to_the_job(init: Callable | None) -> Callable:
    """A DataLoader `worker_init_fn` (around `init`) for workers that leave stopping to the job's process.
    A terminal's Ctrl-C and a cluster's SIGTERM reach the workers too, and torch fails the job when a
    worker dies, before it could stop at its next optimizer step; the job's process ends its workers
    itself, as it always does."""
    if isinstance(init, functools.partial) and init.func is _worker_ignores_stops:
        return init
    return functools.partial(_worker_ignores_stops, init)
