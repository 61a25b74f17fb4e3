"""attention: sdpa | eager | flash_attention_2 (the model's attention kernel)."""


def apply(cfg, plan) -> None:
    plan.load_kwargs["attn_implementation"] = cfg.implementation.value
