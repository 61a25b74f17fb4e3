"""dataloader: default | fast (worker processes, pinned memory, persistent workers, prefetch)."""


def apply(cfg, setup) -> None:
    setup.args.update(dataloader_num_workers=cfg.num_workers, dataloader_pin_memory=cfg.pin_memory,
                     dataloader_persistent_workers=cfg.persistent_workers and cfg.num_workers > 0)
    if cfg.num_workers > 0 and cfg.prefetch_factor:
        setup.args["dataloader_prefetch_factor"] = cfg.prefetch_factor
    setup.group_by_length = cfg.group_by_length
