"""One way for the benchmarks' named adjustments (older_libraries.py, fsdp1.py, litgpt.py) to make installed
code step as another library's did for the length of an estimate, and to put it back."""
import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def patched(replacements: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Each (owner, attribute, value) set for the block and restored after it; an owner that is a dict (a
    library's registry, such as transformers' LOSS_MAPPING) has the entry of that key set instead."""
    def get(owner, name):
        return owner[name] if isinstance(owner, dict) else getattr(owner, name)

    def put(owner, name, value):
        if isinstance(owner, dict):
            owner[name] = value
        else:
            setattr(owner, name, value)

    installed = [(owner, name, get(owner, name)) for owner, name, _ in replacements]
    for owner, name, value in replacements:
        put(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in installed:
            put(owner, name, value)
