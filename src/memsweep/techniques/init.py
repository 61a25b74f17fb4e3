"""init: default | device (instantiate the weights directly on the target device, no host copy first)."""


def apply(cfg, plan) -> None:
    if cfg.on_device:
        plan.load_kwargs["device_map"] = plan.device
