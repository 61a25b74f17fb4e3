"""The command line, checked before Hydra composes it (`train.py` and `python -m memsweep.app.estimate`):
one line naming the key where Hydra would answer in many lines, or with its lexer's error.

- `group_options`: a `group=option` naming no conf/<group>/<option>.yaml, and a launcher whose plugin
  is an extra that is not installed (`hydra/launcher=ray`);
- `characters`: a number typed with a character Python does not read in one: a Unicode minus
  (`3e−4`), a thousands separator (`1,000`, `1 000`), a decimal comma (`0,001`);
- `typed`: each value of a `key=value` (every value of a sweep) as OmegaConf judges it on the typed
  schema, and a key the schema does not have.
"""
import dataclasses
import re
import types
import typing
import unicodedata
from typing import Any

from ..errors import ConfigError
from . import constraints
from .schema import CONF_DIR, Config

# Written between digits, each means a thousands separator to a person; to Hydra a comma separates the
# values of a sweep and the others end the number.
SEPARATORS = ",'_\u00a0\u2009\u202f "
THOUSANDS = re.compile(r"^[+-]?\d{1,3}([,'_\u00a0\u2009\u202f ]\d{3})+(\.\d*)?$")


def arguments(args: list[str], multirun: bool | None = None) -> None:
    """Every check of the command line, in the order a person reads the messages. `multirun`: whether
    comma lists are sweeps (default: whether the arguments hold -m)."""
    if multirun is None:
        multirun = any(a in ("-m", "--multirun") for a in args)
    group_options(args)
    overrides = [a for a in args if not a.startswith("-") and "=" in a]
    for arg in overrides:
        key, _, value = arg.partition("=")
        characters(key.lstrip("+~"), value, multirun)
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for arg in overrides:
        key = arg.partition("=")[0].lstrip("+~")
        try:
            override = parser.parse_override(arg)
        except Exception as exc:  # noqa: BLE001 - Hydra's grammar error, in one line
            value = arg.partition("=")[2]
            raise ConfigError(key, f"Hydra cannot read {arg!r} ({str(exc).splitlines()[0]}); quote a value with such "
                                   f"characters: {key}='{value}'") from None
        typed(override, multirun)
        free_key(override, args)


def group_options(args: list[str]) -> None:
    """Refuse `group=option` (or a comma list of options) naming no conf/<group>/<option>.yaml."""
    for arg in args:
        key, sep, value = arg.partition("=")
        group = key.lstrip("+~")
        if group == "hydra/launcher":
            launcher_installed(value)
        if arg.startswith("-") or not sep or not group.isidentifier() or not (CONF_DIR / group).is_dir():
            continue  # a flag, a plain key (`lr=...`), `hydra/launcher=...`: Hydra or the schema checks it
        if any(c in value for c in "()[]{}$'\""):
            continue  # glob(...), range(...), interpolations: Hydra expands them
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        for name in value.split(","):
            if name not in options and name != "null":
                raise ConfigError(group, f"{name!r} is not an option; allowed: {', '.join(options)} "
                                         f"(conf/{group}/*.yaml)")


# Launchers whose Hydra plugin is an optional extra of pyproject.toml: option -> (plugin module, extra).
EXTRA_LAUNCHERS = {"ray": ("hydra_plugins.hydra_ray_launcher", "ray")}


def launcher_installed(option: str) -> None:
    """`hydra/launcher=<option>` whose plugin is not installed: one line naming the extra (Hydra would fail
    to import its `_target_` after composing the sweep)."""
    import importlib.util

    module, extra = EXTRA_LAUNCHERS.get(option, (None, None))
    if module is not None and importlib.util.find_spec(module) is None:
        raise ConfigError("hydra/launcher", f"{option} needs the `{extra}` extra, which is not installed: "
                                            f"pip install -e '.[{extra}]' (pyproject.toml)")
    launcher_runs_here(option)


# Launchers that hand the jobs to a scheduler: option -> the command of it the launcher runs (submitit's sbatch).
SCHEDULER_LAUNCHERS = {"slurm": "sbatch", "submitit_slurm": "sbatch"}


def launcher_runs_here(option: str) -> None:
    """`hydra/launcher=slurm` on a machine without Slurm (no `sbatch` on PATH): one line naming the launchers
    that run here, before Hydra composes the sweep (submitit would fail in a traceback as it submits)."""
    import shutil

    command = SCHEDULER_LAUNCHERS.get(option)
    if command is None or shutil.which(command) is not None:
        return
    here = [p.stem + (f" (the `{EXTRA_LAUNCHERS[p.stem][1]}` extra)" if p.stem in EXTRA_LAUNCHERS else "")
            for p in sorted((CONF_DIR / "hydra" / "launcher").glob("*.yaml")) if p.stem not in SCHEDULER_LAUNCHERS]
    raise ConfigError("hydra/launcher", f"{option} submits to Slurm, and this machine has no `{command}` on PATH (not "
                                        "a Slurm login node); allowed: basic (Hydra's default: one job after the "
                                        f"other), {', '.join(here)} (conf/hydra/launcher)")


def _is_minus(ch: str) -> bool:
    return ch != "-" and (unicodedata.category(ch) == "Pd" or unicodedata.name(ch, "").endswith("MINUS SIGN"))


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def characters(key: str, value: str, multirun: bool) -> None:
    """A number with a minus Python does not read, or with a thousands separator or decimal comma."""
    for i, ch in enumerate(value):
        if _is_minus(ch):
            fixed = "".join("-" if _is_minus(c) else c for c in value)
            if any(_is_number(piece) for piece in re.split(r"[,\s\[\]()=:]+", fixed)):
                raise ConfigError(key, f"{value!r} has a {unicodedata.name(ch).lower()} (U+{ord(ch):04X}) at character "
                                       f"{i + 1}, not the ASCII minus '-' a number needs; type {fixed!r}")
    _separators(key, value, multirun)


def _separators(key: str, value: str, multirun: bool) -> None:
    """In a numeric key, a comma (or space, apostrophe) between digits that no sweep means."""
    fraction = re.match(r"^[+-]?\d+,(\d+)$", value)
    if _plain(_field(key)) is float and fraction and not THOUSANDS.match(value) and (
            not multirun or fraction.group(1).startswith("0")):  # `-m epochs=1,2` is a sweep
        raise ConfigError(key, f"{value!r} has a decimal comma, which a number cannot hold (in an override a comma "
                               f"separates the values of a sweep); type {value.replace(',', '.')}")
    if not (_numeric(key) and THOUSANDS.match(value)):
        return
    groups = re.split(f"[{SEPARATORS}]", value)
    if multirun and "," in value and not any(g.startswith("0") for g in groups[1:]):
        return  # `-m batch_size=8,128`: a sweep of two values
    sep = next(c for c in value if c in SEPARATORS)
    point = sep == "," and groups[0].lstrip("+-") == "0" and len(groups) == 2
    fix = f"{groups[0]}.{groups[1]} (a decimal point)" if point else f"{''.join(groups)} (no separator)"
    raise ConfigError(key, f"{value!r} has {unicodedata.name(sep).lower()} {sep!r}, which a number cannot hold"
                           + (" (in an override a comma separates the values of a sweep)" if sep == "," else "")
                           + f"; type {fix}")


def _numeric(key: str) -> bool:
    tp = _plain(_field(key))
    return tp in (int, float)


def _plain(tp: Any) -> Any:
    """`X | None` (or `Optional[X]`) -> X, and `Annotated[X, constraint]` -> X."""
    if typing.get_origin(tp) is typing.Annotated:
        return _plain(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return _plain(rest[0]) if len(rest) == 1 else tp
    return tp


def field_type(f: dataclasses.Field) -> Any:
    return f.default_factory if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(
        f.default_factory) else f.type


def _field(key: str) -> Any:
    """The schema type of a dotted key; None where the schema has no such key (or it is inside a free mapping)."""
    schema: Any = Config
    for part in key.split("."):
        if not dataclasses.is_dataclass(schema):
            return None
        fields = {f.name: f for f in dataclasses.fields(schema)}
        if part not in fields:
            return None
        schema = field_type(fields[part])
    return schema


def _inside_free_mapping(key: str) -> bool:
    schema: Any = Config
    for part in key.split("."):
        if not dataclasses.is_dataclass(schema):
            return True  # under a dict[str, Any] or Any key (model.overrides, tags)
        fields = {f.name: f for f in dataclasses.fields(schema)}
        if part not in fields:
            return False
        schema = field_type(fields[part])
    return False


def known(key: str) -> str:
    """The keys beside `key` in the schema (the deepest section of it the schema has), for a message."""
    schema: Any = Config
    for part in key.split(".")[:-1]:
        fields = {f.name: f for f in dataclasses.fields(schema)}
        if part not in fields or not dataclasses.is_dataclass(field_type(fields[part])):
            break
        schema = field_type(fields[part])
    return ", ".join(f.name for f in dataclasses.fields(schema))


def _values(override) -> list[Any]:
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    value = override.value()
    if isinstance(value, ChoiceSweep):
        return list(value.list)
    if isinstance(value, RangeSweep):
        return [value.start]
    if isinstance(value, IntervalSweep):  # a search's range (hparams_search): both of its ends
        return [value.start, value.end]
    return [] if override.is_sweep_override() else [value]  # glob(...): the sweeper's


def typed(override, multirun: bool, node: Any | None = None) -> None:
    """A `key=value` as OmegaConf judges it on the typed schema; group selections and Hydra's own keys are
    left to group_options and Hydra."""
    from omegaconf import OmegaConf

    key = override.key_or_group
    if key.startswith("hydra") or "/" in key or override.is_delete() or (CONF_DIR / key).is_dir():
        return
    if override.is_sweep_override() and not multirun and override.value().__class__.__name__ == "ChoiceSweep":
        raise ConfigError(key, f"{override.input_line.partition('=')[2]!r} is several values and a single run takes "
                               "one: sweep them with -m, or quote the value ('a,b'), or make it a list ([a,b])")
    for ref in re.findall(r"\$\{([\w.]+)\}", override.input_line.partition("=")[2]):
        if _field(ref) is None and not _inside_free_mapping(ref):
            beside = _field(ref.rpartition(".")[0]) if "." in ref else Config
            raise ConfigError(key, f"interpolates ${{{ref}}}, which is not a memsweep key"
                                   + (f"; the keys there are {known(ref)}" if dataclasses.is_dataclass(beside) else ""))
    tp = _field(key)
    if tp is None:
        if _inside_free_mapping(key) or override.is_add():
            return  # a free mapping's key, or a group added from a search path: validate.config checks after
        raise ConfigError(key, f"is not a memsweep key; the keys here are {known(key)}")
    if override.is_add() and not override.is_force_add() and not _inside_free_mapping(key):
        raise ConfigError(key, "is a memsweep key already: set it without '+'")
    node = node if node is not None else OmegaConf.structured(Config)
    ends = _values(override)
    if override.value().__class__.__name__ == "IntervalSweep" and not ends[0] < ends[1]:
        raise ConfigError(key, f"{override.input_line.partition('=')[2]!r} is an empty range; allowed: "
                               "interval(low, high) with low < high")
    for value in ends:
        try:
            OmegaConf.update(node, key, value, merge=True)
        except Exception:  # noqa: BLE001 - OmegaConf's ValidationError: the value does not fit the type
            shown = "null" if value is None else repr(value)
            raise ConfigError(key, f"{shown} is not allowed; allowed: {constraints.describe(tp)}") from None
        constraints.check_value(Config, key, _as_python(node, key))  # every value of a sweep: schema.py's bounds


def _as_python(node: Any, key: str) -> Any:
    """A key's value as composed (enums, numbers, plain lists), for its declared constraints."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    value = OmegaConf.select(node, key, throw_on_resolution_failure=False)
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def composition_error(exc: BaseException) -> ConfigError:
    """Hydra's composition error as one line naming the key (OmegaConf's `full_key` where it has one)."""
    cause = exc.__cause__ or exc
    key = getattr(cause, "full_key", None) or "config"
    return ConfigError(key, " ".join(str(cause).strip().splitlines()[0].split()) if str(cause).strip() else
                       type(cause).__name__)


def _chosen_option(group: str, args: list[str]) -> str | None:
    """The option of a group the command line chooses, else the default of conf/config.yaml."""
    from omegaconf import OmegaConf

    for arg in reversed(args):
        key, _, value = arg.partition("=")
        if key.lstrip("+") == group and "," not in value:
            return value
    for entry in OmegaConf.load(CONF_DIR / "config.yaml").defaults:
        if isinstance(entry, dict) or hasattr(entry, "keys"):
            for name, option in entry.items():
                if name == group:
                    return option
    return None


def free_key(override, args: list[str]) -> None:
    """A key of a free mapping (`model.overrides.<key>`): `+` adds one the chosen option does not set, no
    `+` changes one it sets; Hydra refuses the other way round in several lines."""
    from omegaconf import OmegaConf

    key = override.key_or_group
    group = key.split(".")[0]
    if not _inside_free_mapping(key) or override.is_force_add() or not (CONF_DIR / group).is_dir():
        return
    option = _chosen_option(group, args)
    path = CONF_DIR / group / f"{option}.yaml"
    if option is None or not path.is_file():
        return
    present = OmegaConf.select(OmegaConf.load(path), key.partition(".")[2], default=None) is not None
    value = override.input_line.partition("=")[2]
    if override.is_add() and present:
        raise ConfigError(key, f"is set by {group}={option} already: change it without '+' ({key}={value})")
    if not override.is_add() and not present:
        raise ConfigError(key, f"is not set by {group}={option}: add it with '+' (+{key}={value})")
