"""DeepSpeed's compiled ops (its CPU collectives, CPUAdam) are not built at install: DeepSpeed's own op
builder builds each where a job first needs it (torch's JIT extension build, with ninja: about a minute
per op on 2 cores) and torch caches it for every later job of the machine, under TORCH_EXTENSIONS_DIR
(default ~/.cache/torch_extensions/py311_cpu), as <op>/<op>.so.

`load` runs before the job's DeepSpeed engine asks for them: the one console line about a build comes from
here, and the engine then finds each op loaded (the builders share their loaded ops). A job without
DeepSpeed, mode=estimate and mode=plan never come here.
"""
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..techniques import deepspeed as ds_technique


def load(traits) -> None:
    """Load the ops the DeepSpeed engine of a job of these traits (techniques.Techniques) will load, saying
    in one line which must be built first (none: nothing said)."""
    builders = [b for b in map(_builder, ds_technique.op_builders(traits.deepspeed)) if b is not None]
    missing = [b for b in builders if not prebuilt(b) and not cached(b)]
    if missing:
        print(notice([b.name for b in missing], build_root()), flush=True)
    with _ninja_on_path():
        for builder in builders:
            builder.load()


def notice(names: list[str], root: Path) -> str:
    """The line that says what is being built, how long it takes and where it is kept."""
    ops = " and ".join(names)
    each = " each" if len(names) > 1 else ""
    return (f"[memsweep] building DeepSpeed's {ops} op{'s' if len(names) > 1 else ''} for this machine "
            f"(first use only, about 1 min{each}; cached in {root})")


def _builder(class_name: str):
    """The accelerator's op builder of that class, or None where DeepSpeed would not load it (no such op on
    this accelerator, or not compatible here: build_shm_op then falls back to torch's collectives)."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder, compatible = get_accelerator().create_op_builder(class_name), deepspeed.ops.__compatible_ops__
    return builder if builder is not None and builder.NAME in compatible and compatible[builder.NAME] else None


def prebuilt(builder) -> bool:
    """Built into the installed DeepSpeed (DS_BUILD_<OP>=1 at install), for this accelerator: builder.load's test."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import accelerator_name, installed_ops

    return builder.name in installed_ops and bool(installed_ops[builder.name]) and \
        accelerator_name == get_accelerator()._name


def build_root() -> Path:
    """Where torch keeps the ops it builds: TORCH_EXTENSIONS_DIR, or its per-Python, per-accelerator default."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory("", verbose=False))


def cached(builder) -> bool:
    """Built by an earlier job: the library torch's JIT build writes (<root>/<op>/<op>.so; ninja then finds
    nothing to rebuild)."""
    return (build_root() / builder.name / f"{builder.name}.so").exists()


@contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch runs plain `ninja`: put the folder of the one found (the virtualenv's, when it is not activated)
    on PATH while the ops load."""
    folder, before = ds_technique.ninja_dir(), os.environ.get("PATH")
    if folder is not None and folder not in (before or "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([folder, before] if before else [folder])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before
