"""Every key's declaration (schema.py, config/constraints.py) refuses what it does not allow, on every surface.

The keys are read off the schema itself, so a key added later is drawn too: for each, hypothesis draws values
its declaration forbids (0, negative, huge, inf, nan, empty, repeated items, the wrong type, an unknown name)
and a mode (train, mode=estimate, mode=plan); each must end with exit code 2, one line naming the key, no
traceback, before any work, and nothing written but the error record."""
import dataclasses
import math
import types
import typing
from enum import Enum
from pathlib import Path

import pytest
from annotated_types import Ge, Gt, Le, Lt, MinLen
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import TINY
from memsweep.config import constraints
from memsweep.config.schema import Config
from surfaces import assert_refused, estimate_cli, refusal, train_py


def leaves(schema: type = Config, prefix: str = "") -> dict[str, typing.Any]:
    """{dotted key: annotated type} of every key a person sets (not the free mappings: tags, overrides)."""
    out = {}
    for name, tp in typing.get_type_hints(schema, include_extras=True).items():
        if dataclasses.is_dataclass(tp):
            out |= leaves(tp, f"{prefix}{name}.")
        elif tp is not typing.Any and typing.get_origin(tp) is not dict or "tflops" in name:
            out[f"{prefix}{name}"] = tp
    return out


def _unwrap(tp) -> tuple[typing.Any, list]:
    """(the base type, its constraint marks), past `| None` and Annotated."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is not typing.Annotated:
        return tp, []
    base, *metadata = typing.get_args(tp)
    return base, [m for meta in metadata for m in getattr(meta, "metadata", [meta])] + metadata


def _number(x: float) -> str:
    return str(x) if math.isfinite(x) else {math.inf: "inf", -math.inf: "-inf"}.get(x, "nan")


def outside(marks: list, is_int: bool) -> list[float]:
    """Numbers just and far outside the declared bounds (and the non-finite ones a float must refuse)."""
    out = []
    for m in marks:
        bound = next((getattr(m, a) for a in ("gt", "ge", "lt", "le") if hasattr(m, a)), None)
        if isinstance(m, (Gt, Ge)):
            out += [bound - (0 if isinstance(m, Gt) else 1), bound - 10**6]
        elif isinstance(m, (Lt, Le)):
            out += [bound + (0 if isinstance(m, Lt) else 1), bound * 10**6]
    out = [int(x) if is_int else float(x) for x in out]
    finite = any(getattr(m, "allow_inf_nan", None) is False for m in marks)
    return out + ([math.inf, -math.inf, math.nan, 1e400] if finite else [])


def bad_values(tp) -> list[str]:
    """Override texts this declaration refuses."""
    base, marks = _unwrap(tp)
    if isinstance(base, type) and issubclass(base, Enum):
        return ["no_such_option", "7"]
    if base is bool:
        return ["maybe", "[true]"]
    if base in (int, float):
        return ["abc", "[1]"] + [_number(x) for x in outside(marks, base is int)]
    if typing.get_origin(base) is list:
        item = typing.get_args(base)[0]
        texts = ["abc"] + (["[]"] if any(isinstance(m, MinLen) and m.min_length for m in marks) else [])
        texts += ["[2,2]" if _unwrap(item)[0] is int else "[a,a]"] if constraints.DISTINCT in marks else []
        return texts + [f"[{v}]" for v in bad_values(item) if not v.startswith("[") and v != "abc"]
    if typing.get_origin(base) is dict:
        return ["abc"] + [f"{{bf16:{v}}}" for v in bad_values(typing.get_args(base)[1]) if not v.startswith("[")]
    return ["[1]"] if base is str else []


KEYS = {key: bad_values(tp) for key, tp in leaves().items()}
KEYS = {key: values for key, values in KEYS.items() if values}
SURFACES = ("train", "estimate", "plan")


def test_the_keys_come_from_the_schema():
    """The drawn keys cover every section and every declared bound (a key added later is drawn as well)."""
    assert {key.split(".")[0] for key in KEYS} >= {"model", "data", "optim", "lora", "hardware", "plan", "distributed"}
    assert "inf" in KEYS["epochs"] and "0" in KEYS["batch_size"] and "[]" in KEYS["plan.hardware"]
    assert "[2,2]" in KEYS["plan.depths"] and "no_such_option" in KEYS["precision.name"]


def _run(surface: str, override: str, tmp: Path) -> int:
    if surface == "estimate":
        return estimate_cli(TINY + [override], tmp)
    return train_py(TINY + (["mode=plan"] if surface == "plan" else []) + [override], tmp)


@pytest.mark.parametrize("key", sorted(KEYS))
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_value_its_declaration_refuses_is_one_line_before_any_work(key, data, tmp_path_factory, capsys,
                                                                     no_work):
    value = data.draw(st.sampled_from(KEYS[key]), label="value")
    surface = data.draw(st.sampled_from(SURFACES), label="surface")
    out = tmp_path_factory.mktemp("job")
    assert_refused(refusal(lambda: _run(surface, f"{key}={value}", out), capsys), key)
    written = {p.name for p in out.rglob("*") if p.is_file()}
    assert written <= {"results.json", "estimate.log", "train.log"}, written  # the error record, the log
