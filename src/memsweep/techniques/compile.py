"""compile: none | on (torch.compile through Trainer's `torch_compile`)."""
from dataclasses import dataclass

from ..config.schema import is_on


@dataclass(frozen=True)
class Traits:
    on: bool  # the model runs compiled (the memory-ledger step runs eager either way)


def traits(cfg) -> Traits:
    return Traits(on=is_on(cfg))


def apply(cfg, setup) -> None:
    if traits(cfg).on:
        setup.args["torch_compile"] = True
