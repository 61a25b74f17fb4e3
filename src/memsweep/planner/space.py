"""The technique space of a plan: precision x optimizer x checkpointing x LoRA / QLoRA / int8 x where the
state lives x micro-batch, accumulation keeping the effective batch, each combination as the job it would be;
and what each combination changes about the training, so a row shows its quality risk beside its speed.

Where the state lives (`placements`): on one process, the `offload` options (torchao's optimizer offload,
activations in host memory); over several, DDP (each process holds everything) and the `deepspeed` and `fsdp`
options that shard it (techniques/rules.py refuses offload=optimizer with several processes: DeepSpeed's and
FSDP2's own offload options take its place there)."""
import dataclasses
import functools
import itertools
from collections.abc import Iterator

from ..config.schema import CONF_DIR, Config, OptimConf
from ..errors import ConfigError
from ..techniques import optim
from .twin import family

GROUPS = ("precision", "optim", "checkpointing", "lora", "offload", "deepspeed", "fsdp")
PLACEMENT = GROUPS[4:]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_plan_keys(job: Config) -> None:
    """Bad input refused in one line naming the key and its allowed values (exit 2, as validate.py)."""
    plan = job.plan
    for key, group in (("hardware", "hardware"), *((g, g) for g in GROUPS), ("lora_optim", "optim"),
                       ("lora_offload", "offload")):
        allowed = [o for o in options(group) if o != "auto"]
        for value in getattr(plan, key):
            if value not in allowed:
                raise ConfigError(f"plan.{key}", f"unknown option {value!r}; allowed: {', '.join(allowed)}")
    if not plan.hardware:
        raise ConfigError("plan.hardware", "name at least one GPU profile, e.g. plan.hardware=[t4,a100_40gb]")
    for m in plan.micro_batches:
        if m < 1 or per_rank(job) % m:
            raise ConfigError("plan.micro_batches", f"{m} does not divide each process's batch, batch_size / "
                                                    f"processes = {per_rank(job)}")
    if plan.workers < 0:
        raise ConfigError("plan.workers", f"{plan.workers}: a number of processes >= 1, or 0 for one per CPU")
    if plan.top < 1 or (plan.depths and (len(plan.depths) != 2 or min(plan.depths) < 1)):
        raise ConfigError("plan.top / plan.depths", "top must be >= 1 and depths two depths >= 1 (or [] for full traces)")


def per_rank(job: Config) -> int:
    """The sequences each process takes a step: the effective batch over the job's processes."""
    return job.batch_size // job.distributed.world_size


def micro_batches(job: Config) -> list[int]:
    """Ascending: the search stops at the first one that fits no GPU (memory grows with it)."""
    return sorted(job.plan.micro_batches) or [m for m in range(1, per_rank(job) + 1) if per_rank(job) % m == 0]


def combinations(job: Config) -> Iterator[dict[str, str]]:
    plan = job.plan
    for precision, checkpointing, lora in itertools.product(plan.precision, plan.checkpointing, plan.lora):
        for optim in plan.optim if lora == "none" else plan.lora_optim:
            for placed in placements(job, lora):
                yield {"precision": precision, "optim": optim, "checkpointing": checkpointing, "lora": lora, **placed}


def placements(job: Config, lora: str) -> list[dict[str, str]]:
    """Where weights, gradients, optimizer state and activations live: with one process the plan's `offload`
    options (the job's own deepspeed / fsdp kept); with several, DDP and each `deepspeed` and `fsdp` option
    that is on (the job's own offload kept)."""
    plan, own = job.plan, {g: str(getattr(job, g).name) for g in PLACEMENT}  # a StrEnum as its option name
    if job.distributed.world_size == 1:
        return [{**own, "offload": o} for o in dict.fromkeys(plan.offload if lora == "none" else plan.lora_offload)]
    ddp = {**own, "deepspeed": "none", "fsdp": "none"}
    sharded = [{**ddp, "deepspeed": o} for o in plan.deepspeed if o != "none"]
    return [ddp] * ("none" in plan.deepspeed or "none" in plan.fsdp) + sharded + [
        {**ddp, "fsdp": o} for o in plan.fsdp if o != "none"]


def units(job: Config) -> list[list[tuple[int, dict[str, str]]]]:
    """The combinations, numbered in the space's order, in units a worker searches alone: a combination
    and its precision twin (planner/twin.py: the one's trace serves the other) are one unit. LoRA-family
    units first: their small weights and state fit at the most micro-batches, so they trace the most, and a
    long unit is not left for last."""
    grouped: dict[tuple, list] = {}
    for n, combo in enumerate(combinations(job), 1):
        key = (combo["lora"] == "none", family(combo["precision"]), *(combo[g] for g in GROUPS[1:]))
        grouped.setdefault(key, []).append((n, combo))
    return [grouped[key] for key in sorted(grouped, key=lambda k: k[0])]


def section(group: str, option: str, kind):
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.structured(kind), OmegaConf.load(CONF_DIR / group / f"{option}.yaml"))
    return OmegaConf.to_object(merged)


def variant(job: Config, combo: dict[str, str], micro_batch: int) -> Config:
    """The job with the combination's group options and micro-batch (accumulation keeps batch_size, over the
    job's processes)."""
    changes = {g: section(g, o, type(getattr(job, g))) for g, o in combo.items()}
    return at_micro_batch(dataclasses.replace(job, **changes), micro_batch)


def at_micro_batch(job: Config, m: int) -> Config:
    """The job at micro-batch m: accumulation makes up each process's share of batch_size."""
    steps = per_rank(job) // m
    return dataclasses.replace(job, accumulation=dataclasses.replace(job.accumulation, name=f"x{steps}", steps=steps))


@functools.cache
def state_bits(option: str) -> int:
    """The bits of each optimizer moment the `optim` option stores (techniques/optim.py owns what it means)."""
    return optim.traits(section("optim", option, OptimConf).hf_name).state_bits


def changes_to_training(combo: dict[str, str]) -> str:
    """What the combination changes about what is trained and how, beside full fine-tuning in fp32."""
    said = {"bf16_true": "bf16 weights and updates (no fp32 master copy)", "bf16": "bf16 autocast, fp32 master",
            "fp16_true": "fp16 weights and updates (no fp32 master copy, no loss scaling)", "fp64": "fp64 throughout",
            "fp16": "fp16 autocast + loss scaling, fp32 master", "fp32": "fp32", "tf32": "TF32 matmuls"}
    parts = [said.get(combo["precision"], combo["precision"])]
    parts.append({"none": "all weights trained", "r8": "base frozen, LoRA r8 adapters",
                  "r16": "base frozen, LoRA r16 adapters", "qlora": "base frozen and quantized to 4-bit NF4, LoRA",
                  "int8": "base frozen and quantized to 8-bit (LLM.int8), LoRA"}.get(combo["lora"], combo["lora"]))
    bits = state_bits(combo["optim"])
    if bits < 32:
        parts.append(f"{bits}-bit optimizer state")
    elif combo["optim"] == "adafactor":
        parts.append("Adafactor (factored second moment)")
    if combo["checkpointing"] != "none":
        parts.append("recomputes the forward (same result)")
    return "; ".join(parts + placed(combo))


def placed(combo: dict[str, str]) -> list[str]:
    """What a combination's placement changes: where things live, not what is computed, except DeepSpeed's
    own mixed precision (its fp32 master copy, and in fp16 its loss scaler, in place of Trainer's)."""
    said = {"optimizer": "optimizer state and step on the host (same result)",
            "optimizer_and_grads": "gradients, optimizer state and step on the host (same result)",
            "activations": "saved activations in host memory (same result)"}
    parts = [said[combo["offload"]]] if combo.get("offload", "none") in said else []
    if combo.get("deepspeed", "none") != "none":
        scaler = " and loss scaler" if combo["precision"] == "fp16" else ""
        parts.append(f"DeepSpeed {combo['deepspeed']} (its own fp32 master weights{scaler})")
    if combo.get("fsdp", "none") != "none":
        parts.append(f"FSDP2 {combo['fsdp']} (same result)")
    return parts
