"""One module per config group. Each exposes `apply(section, setup)`, reading only its own section and
the setup (setup.py carries what a technique needs from outside its group), and, where others ask what
its options mean, `traits(section)`.

`APPLY_ORDER` is the order the groups write into the setup (and so the order of model transforms):
the model is loaded (precision, attention, init, lora quantization), then frozen, then wrapped by
LoRA, then checkpointed.

`Techniques` is every group's traits for one job: what the rules, the estimator and the reports read
(through the setup), so no module outside a group interprets that group's keys.
"""
from dataclasses import dataclass

from . import (
    accumulation,
    attention,
    checkpointing,
    compile,
    dataloader,
    deepspeed,
    freezing,
    fsdp,
    init,
    lora,
    offload,
    optim,
    precision,
)

APPLY_ORDER = [
    ("precision", precision),
    ("attention", attention),
    ("init", init),
    ("optim", optim),
    ("accumulation", accumulation),
    ("freezing", freezing),
    ("lora", lora),
    ("checkpointing", checkpointing),
    ("offload", offload),
    ("compile", compile),
    ("deepspeed", deepspeed),
    ("fsdp", fsdp),
    ("dataloader", dataloader),
]


@dataclass(frozen=True)
class Techniques:
    precision: precision.Traits
    optim: optim.Traits
    attention: attention.Traits
    lora: lora.Traits
    checkpointing: checkpointing.Traits
    offload: offload.Traits
    compile: compile.Traits
    deepspeed: deepspeed.Traits
    fsdp: fsdp.Traits
    accumulation_steps: int  # micro-batches per optimizer step
    processes: int  # the job's ranks: distributed.nodes x distributed.nproc


def traits_of(job) -> Techniques:
    """What each group's option means for this job, asked of the group's own module."""
    return Techniques(precision=precision.traits(job.precision.name), optim=optim.traits(job.optim.hf_name),
                      attention=attention.traits(job.attention), lora=lora.traits(job.lora),
                      checkpointing=checkpointing.traits(job.checkpointing), offload=offload.traits(job.offload),
                      compile=compile.traits(job.compile), deepspeed=deepspeed.traits(job.deepspeed),
                      fsdp=fsdp.traits(job.fsdp), accumulation_steps=job.accumulation.steps,
                      processes=job.distributed.nodes * job.distributed.nproc)


def apply_all(job, setup) -> None:
    for group, module in APPLY_ORDER:
        module.apply(getattr(job, group), setup)
