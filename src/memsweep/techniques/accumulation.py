"""accumulation: none | x4 | x32. The effective batch_size stays; the micro-batch is divided."""


def apply(cfg, plan) -> None:
    plan.accumulation_steps = cfg.steps
    plan.micro_batch_size = plan.batch_size // (cfg.steps * plan.world_size)
    plan.args["gradient_accumulation_steps"] = cfg.steps
    plan.args["per_device_train_batch_size"] = plan.micro_batch_size
