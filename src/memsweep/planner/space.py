"""The technique space of a plan: each combination of precision, optimizer, checkpointing, LoRA / QLoRA / int8
and where the state lives (a `Combination`), at each micro-batch, as the job it would be; and what each
combination changes about the training, so a row shows its quality risk beside its speed. How the space is
laid out and searched: docs/planner.md."""
import dataclasses
import functools
import itertools
from collections.abc import Iterator

from ..config.hardware import is_this_machine, load_profile, this_machine
from ..config.schema import CONF_DIR, Config, OptimConf
from ..errors import ConfigError
from ..techniques.optim import traits
from .twin import family

# the conf groups a combination picks an option of (plan.<group> lists the options searched)
GROUPS = ("precision", "optim", "checkpointing", "lora", "offload", "deepspeed", "fsdp")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where weights, gradients, optimizer state and activations live: an option of conf/offload, conf/deepspeed
    and conf/fsdp ("none" of each: every process holds them all on its GPU)."""
    offload: str = "none"
    deepspeed: str = "none"
    fsdp: str = "none"

    def options(self) -> dict[str, str]:
        """{group: option}."""
        return {"offload": self.offload, "deepspeed": self.deepspeed, "fsdp": self.fsdp}

    @property
    def overrides(self) -> str:
        """The overrides that say where the state lives ("deepspeed=zero2"), or "none"."""
        return " ".join(f"{g}={o}" for g, o in self.options().items() if o != "none") or "none"


@dataclasses.dataclass(frozen=True)
class Combination:
    """One point of the space: an option of each group, as conf/<group>/<option>.yaml names it."""
    precision: str
    optim: str
    checkpointing: str
    lora: str
    placement: Placement = Placement()

    def options(self) -> dict[str, str]:
        """{group: option}, in the order of GROUPS."""
        return {"precision": self.precision, "optim": self.optim, "checkpointing": self.checkpointing,
                "lora": self.lora, **self.placement.options()}

    @property
    def changes(self) -> str:
        """What the combination changes about what is trained and how, beside full fine-tuning in fp32."""
        said = {"bf16_true": "bf16 weights and updates (no fp32 master copy)", "bf16": "bf16 autocast, fp32 master",
                "fp16_true": "fp16 weights and updates (no fp32 master copy, no loss scaling)",
                "fp64": "fp64 throughout", "fp16": "fp16 autocast + loss scaling, fp32 master", "fp32": "fp32",
                "tf32": "TF32 matmuls"}
        parts = [said.get(self.precision, self.precision)]
        parts.append({"none": "all weights trained", "r8": "base frozen, LoRA r8 adapters",
                      "r16": "base frozen, LoRA r16 adapters", "qlora": "base frozen and quantized to 4-bit NF4, LoRA",
                      "int8": "base frozen and quantized to 8-bit (LLM.int8), LoRA"}.get(self.lora, self.lora))
        bits = state_bits(self.optim)
        if bits < 32:
            parts.append(f"{bits}-bit optimizer state")
        elif self.optim == "adafactor":
            parts.append("Adafactor (factored second moment)")
        if self.checkpointing != "none":
            parts.append("recomputes the forward (same result)")
        return "; ".join(parts + placed(self))


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_plan_keys(job: Config) -> None:
    """What the plan's lists name (options of conf/<group>/, micro-batches of the batch), refused in one line
    naming the key and its allowed values (exit 2, as validate.py); their sizes and values schema.py declares."""
    plan = job.plan
    for key, group in (("hardware", "hardware"), *((g, g) for g in GROUPS), ("lora_optim", "optim"),
                       ("lora_offload", "offload")):
        allowed = [o for o in options(group) if o != "auto" or group == "hardware"]
        for value in getattr(plan, key):
            if value not in allowed:
                raise ConfigError(f"plan.{key}", f"unknown option {value!r}; allowed: {', '.join(allowed)}")
    named = profiles(job)
    for name in named:
        load_profile(name)  # each profile as a `hardware.*` key of the command line would be
    if plan.run and not any(is_this_machine(h) for h in named):
        raise ConfigError("plan.run", f"{plan.run} rows to run, but no profile of plan.hardware "
                                      f"([{','.join(plan.hardware)}]) is this machine ({this_machine()}); allowed: 0, "
                                      "or plan.hardware naming auto, cpu or the CUDA card here")
    for m in plan.micro_batches:
        if per_rank(job) % m:
            raise ConfigError("plan.micro_batches", f"{m} does not divide each process's batch, batch_size / "
                                                    f"processes = {per_rank(job)}")


def profiles(job: Config) -> list[str]:
    """The plan's GPU profiles by option name, `auto` read as this machine's (the CPU's, or the card's here);
    a card without a profile is refused, naming it, as the planner needs a profile's rates."""
    names = []
    for name in job.plan.hardware:
        here = this_machine() if name == "auto" else name
        if here not in options("hardware"):
            raise ConfigError("plan.hardware", f"auto is this machine's {here}; allowed: the profiles "
                                               f"{', '.join(o for o in options('hardware') if o != 'auto')}")
        if here not in names:
            names.append(here)
    return names


def per_rank(job: Config) -> int:
    """The sequences each process takes a step: the effective batch over the job's processes."""
    return job.batch_size // job.distributed.world_size


def micro_batches(job: Config) -> list[int]:
    """Ascending: the search stops at the first one that fits no GPU (memory grows with it)."""
    return sorted(job.plan.micro_batches) or [m for m in range(1, per_rank(job) + 1) if per_rank(job) % m == 0]


def combinations(job: Config) -> Iterator[Combination]:
    plan = job.plan
    for precision, checkpointing, lora in itertools.product(plan.precision, plan.checkpointing, plan.lora):
        for optim in plan.optim if lora == "none" else plan.lora_optim:
            for placement in placements(job, lora):
                yield Combination(precision=precision, optim=optim, checkpointing=checkpointing, lora=lora,
                                  placement=placement)


def placements(job: Config, lora: str) -> list[Placement]:
    """Where weights, gradients, optimizer state and activations live: with one process the plan's `offload`
    options (the job's own deepspeed / fsdp kept); with several, DDP and each `deepspeed` and `fsdp` option
    that is on (the job's own offload kept)."""
    plan = job.plan
    # the job's own options (a StrEnum as its option name)
    own = Placement(offload=str(job.offload.name), deepspeed=str(job.deepspeed.name), fsdp=str(job.fsdp.name))
    if job.distributed.world_size == 1:
        offload = plan.offload if lora == "none" else plan.lora_offload
        return [dataclasses.replace(own, offload=o) for o in dict.fromkeys(offload)]
    ddp = dataclasses.replace(own, deepspeed="none", fsdp="none")
    sharded = [dataclasses.replace(ddp, deepspeed=o) for o in plan.deepspeed if o != "none"]
    return [ddp] * ("none" in plan.deepspeed or "none" in plan.fsdp) + sharded + [
        dataclasses.replace(ddp, fsdp=o) for o in plan.fsdp if o != "none"]


def units(job: Config) -> list[list[tuple[int, Combination]]]:
    """The combinations, numbered in the space's order, in units a worker searches alone: a combination
    and its precision twin (planner/twin.py: the one's trace serves the other) are one unit. LoRA-family
    units first: their small weights and state fit at the most micro-batches, so they trace the most, and a
    long unit is not left for last."""
    grouped: dict[Combination, list[tuple[int, Combination]]] = {}
    for n, combo in enumerate(combinations(job), 1):
        twins = dataclasses.replace(combo, precision=family(combo.precision))  # the unit's one name
        grouped.setdefault(twins, []).append((n, combo))
    return [grouped[twins] for twins in sorted(grouped, key=lambda twins: twins.lora == "none")]


def section(group: str, option: str, kind):
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.structured(kind), OmegaConf.load(CONF_DIR / group / f"{option}.yaml"))
    return OmegaConf.to_object(merged)


def variant(job: Config, combo: Combination, micro_batch: int) -> Config:
    """The job with the combination's group options and micro-batch (accumulation keeps batch_size, over the
    job's processes)."""
    sections = {g: section(g, o, type(getattr(job, g))) for g, o in combo.options().items()}
    return at_micro_batch(dataclasses.replace(job, **sections), micro_batch)


def at_micro_batch(job: Config, m: int) -> Config:
    """The job at micro-batch m: accumulation makes up each process's share of batch_size."""
    steps = per_rank(job) // m
    return dataclasses.replace(job, accumulation=dataclasses.replace(job.accumulation, name=f"x{steps}", steps=steps))


@functools.cache
def state_bits(option: str) -> int:
    """The bits of each optimizer moment the `optim` option stores (techniques/optim.py owns what it means)."""
    return traits(section("optim", option, OptimConf).hf_name).state_bits


def placed(combo: Combination) -> list[str]:
    """What a combination's placement changes: where things live, not what is computed, except DeepSpeed's
    own mixed precision (its fp32 master copy, and in fp16 its loss scaler, in place of Trainer's)."""
    said = {"optimizer": "optimizer state and step on the host (same result)",
            "optimizer_and_grads": "gradients, optimizer state and step on the host (same result)",
            "activations": "saved activations in host memory (same result)"}
    placement = combo.placement
    parts = [said[placement.offload]] if placement.offload in said else []
    if placement.deepspeed != "none":
        scaler = " and loss scaler" if combo.precision == "fp16" else ""
        parts.append(f"DeepSpeed {placement.deepspeed} (its own fp32 master weights{scaler})")
    if placement.fsdp != "none":
        parts.append(f"FSDP2 {placement.fsdp} (same result)")
    return parts
