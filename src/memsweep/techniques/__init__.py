"""One module per config group. Each exposes `apply(section, plan)`, reading only its own section and
the plan (plan.py carries what a technique needs from outside its group).

`APPLY_ORDER` is the order the groups write into the plan (and so the order of model transforms):
the model is loaded (precision, attention, init, lora quantization), then frozen, then wrapped by
LoRA, then checkpointed.
"""
from . import accumulation, attention, checkpointing, compile, dataloader, deepspeed, freezing, fsdp, init, lora, offload, optim, precision

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


def apply_all(job, plan) -> None:
    for group, module in APPLY_ORDER:
        module.apply(getattr(job, group), plan)
