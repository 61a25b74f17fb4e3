"""init: none | device (instantiate the weights directly on the target device, no host copy first)."""
from dataclasses import dataclass

from ..config.schema import is_on


@dataclass(frozen=True)
class Traits:
    on_device: bool


def traits(cfg) -> Traits:
    return Traits(on_device=is_on(cfg))


def apply(cfg, setup) -> None:
    if traits(cfg).on_device:
        setup.load_kwargs["device_map"] = setup.device
