"""attention: sdpa | eager | flash_attention_2 (the model's attention kernel)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Traits:
    implementation: str  # transformers' attn_implementation


def traits(cfg) -> Traits:
    return Traits(implementation=cfg.implementation.value)


def apply(cfg, setup) -> None:
    setup.load_kwargs["attn_implementation"] = traits(cfg).implementation
