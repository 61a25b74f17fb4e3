"""The keys of mode=plan (`plan.*`): the technique space the planner (planner/) searches for the fastest
combination that fits each GPU, and how it searches. Apart from schema.py's groups: they configure no job,
they list the options of many. Which options a list may name (conf/<group>/*.yaml) planner/space.py checks."""
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import AfterValidator, Field

from .constraints import DISTINCT, INT32_MAX, Count, CountOrZero

# A searched axis: at least one option (an empty axis is an empty plan), none twice (a repeated row).
Options = Annotated[list[str], Field(min_length=1), DISTINCT]


def _two_or_none(depths: list[int]) -> list[int]:
    if len(depths) not in (0, 2):
        raise ValueError(f"{len(depths)} depths")
    return depths


# Two distinct depths to extrapolate from (a line through two points), or none: every row at full depth.
Depths = Annotated[list[Count], DISTINCT, AfterValidator(_two_or_none),
                   Field(description="[] (full-depth traces) or two distinct integers > 0, e.g. [2,3]")]


# A confirming run times the steps after its warm-up step and its ledger step (padded and traced, not timed):
# at least one is left at 3.
RunSteps = Annotated[int, Field(ge=3, le=INT32_MAX)]


@dataclass
class PlanConf:
    """mode=plan (planner/): the technique space searched for the fastest combination that fits."""
    hardware: Options = field(default_factory=lambda: ["t4", "rtx4090", "a100_40gb"])  # conf/hardware options
    precision: Options = field(default_factory=lambda: ["bf16_true", "bf16", "fp16"])
    optim: Options = field(default_factory=lambda: ["adamw", "adamw_8bit", "adafactor"])
    # LoRA-family rows search only these optimizers: the adapters' state is a fraction of a percent
    lora_optim: Options = field(default_factory=lambda: ["adamw"])
    checkpointing: Options = field(default_factory=lambda: ["none", "full"])
    lora: Options = field(default_factory=lambda: ["none", "r8", "qlora", "int8"])
    # Where the state lives (planner/space.py placements): with one process these offload options (LoRA-family
    # rows only lora_offload: their trained state is a fraction of a percent); with several, DDP and these
    # deepspeed and fsdp options
    offload: Options = field(default_factory=lambda: ["none", "optimizer"])
    lora_offload: Options = field(default_factory=lambda: ["none"])
    deepspeed: Options = field(default_factory=lambda: ["none", "zero2", "zero3", "zero3_offload"])
    fsdp: Options = field(default_factory=lambda: ["none", "full_shard", "full_shard_offload"])
    # empty: every divisor of batch_size
    micro_batches: Annotated[list[Count], DISTINCT] = field(default_factory=list)
    # Identical blocks traced at these two depths and extrapolated to the model's (planner/depth.py);
    # empty: every row traced at full depth
    depths: Depths = field(default_factory=lambda: [2, 3])
    workers: CountOrZero = 0  # processes searching the space (planner/parallel.py); 0: one per CPU this process may use
    top: Count = 20  # rows printed per GPU (plan.csv / plan.md keep every row)
    # After planning, the `run` best fitting rows per GPU profile this machine is (auto, the CPU, the CUDA card
    # present), each a short real job of `run_steps` optimizer steps launched as a Hydra multirun
    # (app/confirm.py); their measured step time and memory beside the plan's (plan.md, plan.csv). 0: none.
    run: CountOrZero = 0
    run_steps: RunSteps = 6
