"""What a key may hold, declared once beside its type in schema.py and checked by pydantic.

A schema key is typed `Annotated[<type>, <constraint>]` with a constraint of this module: OmegaConf reads the
type (a wrong type is refused while Hydra composes), pydantic the constraint (`check` validates a whole
config, `check_value` one value of the command line). The message of a refusal comes from the same
declaration (`allowed`), so what a key allows is written in one place.

Bounds beyond the sign are representation limits, each named where it is defined: a count is an int32 (the
index type of torch's kernels and of the tokenizers' and datasets' sizes), bytes are an int64 (torch's memory
counters), so GiB stop at 2**33.
"""
import dataclasses
import functools
import math
import types
import typing
from enum import Enum
from typing import Annotated, Any

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import AfterValidator, Field, TypeAdapter, ValidationError

from ..errors import ConfigError

INT32_MAX = 2**31 - 1  # counts: torch indexes tensors' elements per kernel, and datasets their rows, in int32
GIB_MAX = 2.0**33  # 2**33 GiB = 2**63 bytes: torch's memory counters (and the estimate's) are int64 bytes


def _distinct(items: list) -> list:
    repeated = sorted({str(i) for i in items if items.count(i) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} repeated")
    return items


DISTINCT = AfterValidator(_distinct)  # a list whose items must differ (a planner list: a repeat is a repeated row)

# Integers
Count = Annotated[int, Field(gt=0, le=INT32_MAX)]
CountOrZero = Annotated[int, Field(ge=0, le=INT32_MAX)]
# Floats: every one finite (an infinite or NaN value overflows or poisons the arithmetic it enters)
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]
Gib = Annotated[float, Field(gt=0, le=GIB_MAX, allow_inf_nan=False)]
GibOrZero = Annotated[float, Field(ge=0, le=GIB_MAX, allow_inf_nan=False)]


def describe(tp: Any) -> str:
    """What a key of this annotated schema type takes, in words (the `allowed:` of a refusal)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return "null or " + describe(rest[0]) if len(rest) == 1 else "a value"
    base, marks = tp, []
    if typing.get_origin(tp) is Annotated:
        base, *metadata = typing.get_args(tp)
        said = [meta.description for meta in metadata if getattr(meta, "description", None)]
        if said:
            return said[0]  # the declaration's own words, where bounds alone would not say it
        marks = [m for meta in metadata for m in getattr(meta, "metadata", [meta])]
        if any(getattr(m, "allow_inf_nan", None) is False for m in marks):
            marks.append("finite")
        if any(meta is DISTINCT for meta in metadata):
            marks.append("distinct")
    if typing.get_origin(base) in (typing.Union, types.UnionType):
        return describe(base)
    if isinstance(base, type) and issubclass(base, Enum):
        return ", ".join(str(e.value) for e in base)
    if typing.get_origin(base) is list:
        return _list_words(base, marks)
    if typing.get_origin(base) is dict:
        return f"a mapping of names to {_plural(describe(typing.get_args(base)[1]))}"
    words = {bool: "true or false", int: "an integer", float: "a number", str: "text"}.get(base, "a value")
    return ("a finite number" if "finite" in marks else words) + _bounds(marks)


def _bounds(marks: list) -> str:
    low = next(((">", m.gt) for m in marks if isinstance(m, Gt)), None) or next(
        ((">=", m.ge) for m in marks if isinstance(m, Ge)), ("", 0))
    high = next((("<", m.lt) for m in marks if isinstance(m, Lt)), None) or next(
        (("<=", m.le) for m in marks if isinstance(m, Le)), ("", 0))
    if low[0] == ">=" and high[0]:
        return f" from {_num(low[1])} to {'' if high[0] == '<=' else 'below '}{_num(high[1])}"
    words = [f" {sign} {_num(bound)}" for sign, bound in (low, high) if sign]
    return " and".join(words)


def _list_words(tp: Any, marks: list) -> str:
    item = describe(typing.get_args(tp)[0]) if typing.get_args(tp) else "a value"
    size = next((m.min_length for m in marks if isinstance(m, MinLen)), 0)
    most = next((m.max_length for m in marks if isinstance(m, MaxLen)), None)
    words = "a non-empty list" if size else "a list"
    if most is not None:
        words += f" of at most {most} items"
    words += " of distinct " if "distinct" in marks else " of "
    return words + _plural(item)


def _plural(item: str) -> str:
    for one, many in (("an integer", "integers"), ("a finite number", "finite numbers"), ("a number", "numbers")):
        if item.startswith(one):
            return many + item[len(one):]
    return "items: " + item if item != "text" else "names"


def _num(x: float) -> str:
    """A bound as a person reads it: 2^31-1 and 2^33 rather than their digits."""
    if x == INT32_MAX:
        return "2^31-1"
    if abs(x) >= 2**20 and math.log2(abs(x)).is_integer():
        return f"2^{int(math.log2(abs(x)))}"
    return f"{x:g}" if isinstance(x, float) else str(x)


def annotation(schema: type, key: str) -> Any:
    """The annotated type of a dotted key of a schema dataclass (None where it has no such key)."""
    node: Any = schema
    for part in key.split("."):
        if not dataclasses.is_dataclass(node):
            return None
        hints = typing.get_type_hints(node, include_extras=True)
        if part not in hints:
            return None
        node = hints[part]
    return node


@functools.cache
def _adapter(schema: type) -> TypeAdapter:
    return TypeAdapter(schema)  # built once per schema class: about 30 ms


def check(schema: type, values: dict, prefix: str = "") -> None:
    """Every key of `values` (a schema dataclass as a dict) against its declaration: the first refusal as one
    line naming the key, its value and what is allowed."""
    try:
        _adapter(schema).validate_python(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [str(p) for p in error["loc"]]
        while len(loc) > 1 and annotation(schema, ".".join(loc)) is None:
            loc.pop()  # an item of a list or mapping: the refusal names the key that holds it
        key = ".".join(loc)
        raise _refusal(prefix + key, _at(values, loc), error, annotation(schema, key)) from None


def check_value(schema: type, key: str, value: Any) -> None:
    """One value of a dotted key against its declaration (a value of the command line, a sweep's item)."""
    tp = annotation(schema, key)
    if tp is None:
        return
    try:
        TypeAdapter(tp).validate_python(value)
    except ValidationError as exc:
        raise _refusal(key, value, exc.errors()[0], tp) from None


def _at(values: Any, loc: list[str]) -> Any:
    for part in loc:
        values = values[part] if isinstance(values, dict) else getattr(values, part)
    return values


def _refusal(key: str, value: Any, error: dict, tp: Any) -> ConfigError:
    shown = "null" if value is None else repr(value) if isinstance(value, str) else _shown(value)
    context = error["ctx"] if "ctx" in error else {}
    why = f" ({context['error']})" if "error" in context else ""
    return ConfigError(key, f"{shown}{why} is not allowed; allowed: {describe(tp) if tp is not None else error['msg']}")


def _shown(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return str(value)
