"""fp16 and bf16 mixed precision from one trace.

Why it holds: both keep fp32 master weights, gradients and optimizer state and run the same ops under
autocast (torch's autocast casts the same ops to the same 2-byte width for either dtype; bitsandbytes' compute
dtype is the autocast dtype), so the traced step allocates the same bytes in the same order; fp16 adds the loss
scaling (GradScaler: one multiply of the scalar loss and a few bytes of bookkeeping). Timed, an op of one is an
op of the other at the profile's rate for its own dtype: the trace's ops in the one dtype are read as the
other's. So a combination in fp16 is the same combination in bf16, traced, with its ops relabelled (and the
other way round), within TOLERANCE of its own trace (tests/test_planner.py checks a pair against both traces;
on Llama-3.1-8B the 30 bf16/fp16 row pairs of the default plan, each traced, agreed to 0.01 GiB and 0.1 %).
"""
import dataclasses
import time

from ..config.schema import Config, HardwareConf, PrecisionName
from ..estimate.core import assemble, device_key
from ..estimate.trace import readable_on
from ..run.setup import build_setup

TWINS = {PrecisionName.fp16: PrecisionName.bf16, PrecisionName.bf16: PrecisionName.fp16}
# the stated bound for a twin's figures against the job's own trace (the test's tolerance)
TOLERANCE = 0.005


def family(precision: str) -> str:
    """A precision's and its twin's one name (the first in name order), or the precision's own."""
    other = TWINS.get(PrecisionName(precision))
    return precision if other is None else min(precision, other.value)


def twin_of(job: Config) -> Config | None:
    other = TWINS.get(job.precision.name)
    return None if other is None else dataclasses.replace(job, precision=dataclasses.replace(job.precision, name=other))


def retyped(operands: tuple, theirs: str, ours: str) -> tuple:
    """A product's operands (products.operands) with the twin's 2-byte dtype read as ours."""
    names = {"fp16": "float16", "bf16": "bfloat16"}
    return tuple((name, (*value[:3], names[ours] if value[3] == names[theirs] else value[3])
                  if isinstance(value, tuple) else value) for name, value in operands)


def from_twin(job: Config, profile: HardwareConf, memo: dict):
    """The estimate of `job` from its twin's trace where the memo holds one, else None."""
    twin, started = twin_of(job), time.perf_counter()
    traced = None if twin is None else memo.get(device_key(twin, profile))
    if traced is None or not readable_on(traced, profile):
        return None
    ours, theirs = (p.value for p in (job.precision.name, twin.precision.name))
    def relabel(phase, key, *rest) -> tuple:  # an op's record, timed at our dtype's rate
        return (phase, ours if key == theirs else key, *rest)

    ops = [list(relabel(*op)) for op in traced["roofline_ops"]]
    sequence = [relabel(*op) for op in traced.get("roofline_sequence") or []]
    products = [[phase, op, retyped(operands, theirs, ours), *relabel(phase, key, *rest)[1:]]
                for phase, op, operands, key, *rest in traced.get("roofline_products") or []]
    relabelled = {**traced, "roofline_ops": ops, "roofline_sequence": sequence, "roofline_products": products,
                  "twin": theirs}
    memo[device_key(job, profile)] = relabelled
    return assemble(job, profile, build_setup(job, profile), relabelled, started)
