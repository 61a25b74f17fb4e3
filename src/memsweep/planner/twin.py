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
from ..estimate.products import Operand, TensorSpec
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


def retyped(operands: tuple[Operand, ...], theirs: str, ours: str) -> tuple[Operand, ...]:
    """A product's operands (products.operands) with the twin's 2-byte dtype read as ours."""
    names = {"fp16": "float16", "bf16": "bfloat16"}
    return tuple(o._replace(value=o.value._replace(dtype=names[ours]))
                 if isinstance(o.value, TensorSpec) and o.value.dtype == names[theirs] else o for o in operands)


def from_twin(job: Config, profile: HardwareConf, memo: dict):
    """The estimate of `job` from its twin's trace where the memo holds one, else None."""
    twin, started = twin_of(job), time.perf_counter()
    traced = None if twin is None else memo.get(device_key(twin, profile))
    if traced is None or not readable_on(traced, profile):
        return None
    ours, theirs = (p.value for p in (job.precision.name, twin.precision.name))

    def relabel(record):  # an op's or a product's record, timed at our dtype's rate
        return record._replace(dtype=ours) if record.dtype == theirs else record

    ops = [relabel(op) for op in traced.roofline_ops]
    sequence = [relabel(op) for op in traced.roofline_sequence]
    products = [relabel(p._replace(operands=retyped(p.operands, theirs, ours))) for p in traced.roofline_products]
    relabelled = dataclasses.replace(traced, roofline_ops=ops, roofline_sequence=sequence,
                                     roofline_products=products, twin=theirs)
    memo[device_key(job, profile)] = relabelled
    return assemble(job, profile, build_setup(job, profile), relabelled, started)
