"""compile: off | on (torch.compile through Trainer's `torch_compile`)."""


def apply(cfg, plan) -> None:
    if cfg.enabled:
        plan.args["torch_compile"] = True
