"""Durations and ETAs as a person reads them, for a job's progress (progress.py) and a sweep's
(callbacks.JobProgress). Imports nothing: the Hydra callbacks load it also for `--help`."""


def duration(seconds: float) -> str:
    """`12.3 s`, `3 min 12 s`, `1 h 05 min`."""
    if round(seconds, 1) < 60:
        return f"{seconds:.1f} s"
    minutes = round(seconds) // 60
    if minutes < 60:
        return f"{minutes} min {round(seconds) % 60:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def remaining(done: float, total: float, elapsed: float) -> float | None:
    """Seconds left at the mean rate so far; None before anything is done (no rate yet)."""
    if done <= 0 or total <= 0:
        return None
    return elapsed / done * max(0.0, total - done)
