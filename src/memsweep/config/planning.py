"""The keys of mode=plan (`plan.*`): the technique space the planner (planner/) searches for the fastest
combination that fits each GPU, and how it searches. Apart from schema.py's groups: they configure no job,
they list the options of many."""
from dataclasses import dataclass, field


@dataclass
class PlanConf:
    """mode=plan (planner/): the technique space searched for the fastest combination that fits."""
    hardware: list[str] = field(default_factory=lambda: ["t4", "rtx4090", "a100_40gb"])  # conf/hardware options
    precision: list[str] = field(default_factory=lambda: ["bf16_true", "bf16", "fp16"])
    optim: list[str] = field(default_factory=lambda: ["adamw", "adamw_8bit", "adafactor"])
    # LoRA-family rows search only these optimizers: the adapters' state is a fraction of a percent
    lora_optim: list[str] = field(default_factory=lambda: ["adamw"])
    checkpointing: list[str] = field(default_factory=lambda: ["none", "full"])
    lora: list[str] = field(default_factory=lambda: ["none", "r8", "qlora", "int8"])
    # Where the state lives (planner/space.py placements): with one process these offload options (LoRA-family
    # rows only lora_offload: their trained state is a fraction of a percent); with several, DDP and these
    # deepspeed and fsdp options
    offload: list[str] = field(default_factory=lambda: ["none", "optimizer"])
    lora_offload: list[str] = field(default_factory=lambda: ["none"])
    deepspeed: list[str] = field(default_factory=lambda: ["none", "zero2", "zero3", "zero3_offload"])
    fsdp: list[str] = field(default_factory=lambda: ["none", "full_shard", "full_shard_offload"])
    micro_batches: list[int] = field(default_factory=list)  # empty: every divisor of batch_size
    # Identical blocks traced at these two depths and extrapolated to the model's (planner/depth.py);
    # empty: every row traced at full depth
    depths: list[int] = field(default_factory=lambda: [2, 3])
    workers: int = 0  # processes searching the space (planner/parallel.py); 0: one per CPU this process may use
    top: int = 20  # rows printed per GPU (plan.csv / plan.md keep every row)
