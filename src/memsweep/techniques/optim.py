"""optim: the optimizer, by transformers' `optim` names (adamw_torch, sgd, adafactor, adamw_bnb_8bit, ...)."""


def apply(cfg, plan, job) -> None:
    plan.args.update(optim=cfg.hf_name.value, learning_rate=job.lr, weight_decay=cfg.weight_decay,
                     max_grad_norm=cfg.max_grad_norm, warmup_steps=cfg.warmup_ratio,
                     lr_scheduler_type=cfg.scheduler)
    if cfg.hf_name.value == "sgd":
        plan.args["optim_args"] = f"momentum={cfg.momentum}"
