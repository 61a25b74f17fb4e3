"""accumulation: none | x4 | x32. The effective batch_size stays; the micro-batch is divided."""


def apply(cfg, setup) -> None:
    setup.accumulation_steps = cfg.steps
    setup.micro_batch_size = setup.batch_size // (cfg.steps * setup.world_size)
    setup.args["gradient_accumulation_steps"] = cfg.steps
    setup.args["per_device_train_batch_size"] = setup.micro_batch_size
