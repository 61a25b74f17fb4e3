"""One way for the benchmarks' named adjustments (older_libraries.py, fsdp1.py) to make installed code step as
another library's did for the length of an estimate, and to put it back."""
import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def patched(replacements: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Each (owner, attribute, value) set for the block and restored after it."""
    installed = [(owner, name, getattr(owner, name)) for owner, name, _ in replacements]
    for owner, name, value in replacements:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in installed:
            setattr(owner, name, value)
