"""Typed schema of every config group (Hydra ConfigStore).

Hydra merges each `conf/<group>/<option>.yaml` into the dataclass of its group, so an unknown key
("Key 'lrr' not in 'OptimConf'") or a wrong type ("could not be converted to Float") is refused by
OmegaConf before any code runs. A key with a closed set of values is an Enum (choices.py), whose
message lists the allowed values; what a type cannot say is checked by config/validate.

One way to say "off": a group is off when its option is `none` (`name: none`; `is_on` asks). The
other keys of a group say how it runs when it is on; what each option means belongs to the group's
module in techniques/ (`traits`).
"""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from hydra.core.config_store import ConfigStore
from omegaconf import II
from pydantic import AfterValidator, Field

from .choices import (
    AttentionImpl,
    CheckpointingName,
    CompileName,
    DataSource,
    FreezeName,
    FsdpStrategy,
    InitName,
    LoggerName,
    Mode,
    ModelSource,
    OffloadName,
    OptimName,
    PrecisionName,
    Progress,
    Quantize,
    TaskName,
)
from .constraints import (
    INT32_MAX,
    Count,
    CountOrZero,
    Fraction,
    NonNegative,
    Positive,
)
from .planning import PlanConf
from .running import DistributedConf, HardwareConf, MeasureConf, ReportConf, SearchConf

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"  # one folder per config group
OFF = "none"  # the option name of a group that is off


STEPS = "-1 (train for `epochs`) or an integer from 1 to 2^31-1"  # max_steps > 0 overrides epochs


def _not_zero(steps: int) -> int:
    if steps == 0:
        raise ValueError("0 steps")
    return steps


def is_on(section) -> bool:
    """Whether a config group is on: its option is anything but `none`."""
    return str(getattr(section.name, "value", section.name)) != OFF


class Switch:
    """A group whose other keys say how it runs while it is on: with its option `none` they do nothing,
    so validation refuses them set (config/validate)."""


@dataclass
class ModelConf:
    name: str = "minilm"
    source: ModelSource = ModelSource.embedded
    path: str | None = None  # hub id or local folder (hub); unused for embedded/tiny
    tokenizer: str | None = None  # for a model without its own (tiny); null = the model's own
    dropout: Fraction | None = None  # of hidden states and attention probabilities; null = the model's own
    # The architecture where the weights' own config.json is not on disk (mode=estimate offline): one
    # shipped with memsweep (src/memsweep/archs/<name>.json) or a config.json / model folder path.
    config: str | None = None
    architecture: str | None = None  # else a transformers model_type (bert, llama, qwen2, gpt2, ...)
    vocab_size: Count | None = None  # these size keys override the config.json (null: its own)
    hidden_size: Count | None = None
    num_layers: Count | None = None
    num_heads: Count | None = None
    num_kv_heads: Count | None = None  # grouped-query attention (decoders)
    intermediate_size: Count | None = None
    max_position_embeddings: Count | None = None
    # A pretrained model's size keys may only add parts its weights do not hold (new blocks, a wider layer)
    # when this says they are meant to be randomly initialised (run/validate_model.py); results.json counts them.
    new_parts_random: bool = False
    # Any other config.json key (e.g. `+model.overrides.rope_theta=1e6`).
    overrides: dict[str, Any] = field(default_factory=dict)
    # Where the model's parts are (module paths); null = found from the model itself (structure.py):
    # the embeddings, the blocks, the head, LoRA's default targets (the attention's q/k/v projections)
    # and what stays full precision when the base is quantized (everything outside the blocks).
    embeddings_module: str | None = None
    layers_module: str | None = None
    head_modules: list[str] | None = None
    attention_modules: list[str] | None = None
    quantize_skip_modules: list[str] | None = None


@dataclass
class TaskConf:
    name: TaskName = TaskName.classification


@dataclass
class DataConf:
    name: str = "tweets"
    source: DataSource = DataSource.tweets
    path: str | None = None  # csv: the file; hub: the dataset name
    hub_config: str | None = None
    train_split: str = "train"
    eval_split: str | None = None  # hub only; null = split off the train split
    text_column: str = "text"
    label_column: str = "sentiment"
    # Keep only these label values, in this order (null = every label found, sorted).
    labels: list[str] | None = None
    train_size: Count | None = None  # null = everything left after the eval split
    eval_size: Count = 1000
    drop_duplicates: bool = True
    encoding: str = "utf-8"  # a Python codec name
    # Rows that cannot be used (an empty text, an empty or unknown label) are refused with their count and the
    # first one's row number; true drops them instead, their count printed and kept in results.json.
    drop_invalid: bool = False
    # Pad each batch to a multiple of this many tokens (tensor-core shapes); null = to its longest example.
    pad_to_multiple_of: Count | None = None


@dataclass
class PrecisionConf:
    name: PrecisionName = PrecisionName.fp32


@dataclass
class OptimConf:
    name: str = "adamw"
    hf_name: OptimName = OptimName.adamw_torch_fused
    lr: Positive = 1e-4
    weight_decay: NonNegative = 0.0
    momentum: Fraction = 0.0  # sgd only
    max_grad_norm: NonNegative = 1.0
    warmup_ratio: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0  # of the steps
    scheduler: str = "linear"  # transformers' SchedulerType


@dataclass
class CheckpointingConf(Switch):
    name: CheckpointingName = CheckpointingName.none


@dataclass
class AccumulationConf:
    # Not a Switch: `steps` applies whatever the option's name (none = 1 step; `accumulation.steps=4` works).
    name: str = "none"
    steps: Count = 1  # micro-batch = batch_size / steps


@dataclass
class FreezingConf:
    name: FreezeName = FreezeName.none


@dataclass
class LoraConf(Switch):
    name: str = "none"
    r: Count = 8
    alpha: Positive = 16
    dropout: Fraction = 0.1
    # null = the attention's q/k/v projections (structure.py); a list of module names; or all-linear
    target_modules: Any = None
    quantize: Quantize = Quantize.none
    double_quant: bool = False  # nf4 only: its block scales quantized again (bnb_4bit_use_double_quant)
    # peft's: the adapters of a 16-bit model kept in fp32; false keeps them in the model's dtype
    autocast_adapter_dtype: bool = True


@dataclass
class DeepspeedConf(Switch):
    name: str = "none"
    stage: Annotated[int, Field(ge=0, le=3)] = 0  # ZeRO stage 0-3 (when on)
    offload_optimizer: bool = False
    offload_param: bool = False
    # Gradient values reduced at once; null = Trainer's "auto", hidden_size**2 (DeepSpeed's own default,
    # 5e8, is ~1.9 GiB of fp32 buckets whatever the model). Lightning's DeepSpeedStrategy sets 2e8.
    reduce_bucket_size: Count | None = None
    # Reduce gradients while backward runs: a second reduce bucket (DeepSpeed's default: on for stage 3 only)
    overlap_comm: bool = False


@dataclass
class FsdpConf(Switch):
    name: str = "none"
    strategy: FsdpStrategy = FsdpStrategy.full_shard  # (when on)
    offload: bool = False  # parameters and gradients in host memory (CPUOffloadPolicy)
    # 2: fully_shard (FSDP2); 1: FullyShardedDataParallel with flat parameters, as accelerate's and Lightning's
    # FSDP1 run it (use_orig_params=True)
    version: Annotated[int, Field(ge=1, le=2, description="1 or 2")] = 2


@dataclass
class OffloadConf(Switch):
    name: OffloadName = OffloadName.none


@dataclass
class CompileConf(Switch):
    name: CompileName = CompileName.none


@dataclass
class AttentionConf:
    implementation: AttentionImpl = AttentionImpl.sdpa


@dataclass
class InitConf(Switch):
    name: InitName = InitName.none


@dataclass
class DataloaderConf:
    name: str = "default"
    num_workers: CountOrZero = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: Count | None = None
    # Batches of similar length (shuffled buckets): less padding, same examples per epoch.
    group_by_length: bool = True


@dataclass
class LoggerConf(Switch):
    name: LoggerName = LoggerName.wandb
    project: str = "memsweep"
    entity: str | None = None
    tags: list[str] = field(default_factory=list)
    # wandb's own default waits ~90 s for an unreachable server; fall back to offline sooner.
    init_timeout_s: Positive = 10.0


@dataclass
class Config:
    model: ModelConf = field(default_factory=ModelConf)
    task: TaskConf = field(default_factory=TaskConf)
    data: DataConf = field(default_factory=DataConf)
    precision: PrecisionConf = field(default_factory=PrecisionConf)
    optim: OptimConf = field(default_factory=OptimConf)
    checkpointing: CheckpointingConf = field(default_factory=CheckpointingConf)
    accumulation: AccumulationConf = field(default_factory=AccumulationConf)
    freezing: FreezingConf = field(default_factory=FreezingConf)
    lora: LoraConf = field(default_factory=LoraConf)
    deepspeed: DeepspeedConf = field(default_factory=DeepspeedConf)
    fsdp: FsdpConf = field(default_factory=FsdpConf)
    offload: OffloadConf = field(default_factory=OffloadConf)
    compile: CompileConf = field(default_factory=CompileConf)
    attention: AttentionConf = field(default_factory=AttentionConf)
    init: InitConf = field(default_factory=InitConf)
    dataloader: DataloaderConf = field(default_factory=DataloaderConf)
    hardware: HardwareConf = field(default_factory=HardwareConf)
    logger: LoggerConf = field(default_factory=LoggerConf)
    measure: MeasureConf = field(default_factory=MeasureConf)
    report: ReportConf = field(default_factory=ReportConf)
    distributed: DistributedConf = field(default_factory=DistributedConf)
    search: SearchConf = field(default_factory=SearchConf)

    seed: Annotated[int, Field(ge=0, lt=2**32)] = 42  # numpy's seeds are uint32
    batch_size: Count = 32  # effective: micro-batch x accumulation steps x processes
    eval_batch_size: Count = 128
    lr: Positive = II("optim.lr")  # each optimizer carries its own; `lr=...` overrides
    # A run's steps are a count (an int32), and an epoch is at least one step.
    epochs: Annotated[float, Field(gt=0, le=INT32_MAX, allow_inf_nan=False)] = 1.0
    max_steps: Annotated[int, Field(ge=-1, le=INT32_MAX, description=STEPS), AfterValidator(_not_zero)] = -1
    max_seq_len: Count = 64
    mode: Mode = Mode.train
    plan: PlanConf = field(default_factory=PlanConf)
    # What a job shows while it trains and evaluates, and a sweep before each job (progress.py).
    progress: Progress = Progress.auto
    threads: Count | None = None  # torch intra-op threads; null = torch's default
    # Keep freed host memory for the next step (glibc malloc, measure/host_memory.py): far fewer page faults.
    malloc_reuse: bool = True
    # On a GPU, run the job with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (added to any value already
    # set): the caching allocator grows one segment instead of caching blocks of many sizes (run/procenv.py),
    # and the estimate reserves as it does (estimate/run_replay.py).
    expandable_segments: bool = False
    # Before training, take the largest micro-batch the estimator says fits the hardware profile and
    # raise gradient accumulation so batch_size is kept (recorded in effective.autofit)...
    autofit: bool = False
    # ...keeping this fraction of the capacity free for what the estimate does not see (the CUDA
    # allocator's fragmentation; malloc arenas and thread stacks under a CPU memory_gib cap).
    autofit_headroom: Fraction = 0.15
    tags: dict[str, Any] = field(default_factory=dict)  # what a preset carries (e.g. the ladder row name)


def register_configs() -> None:
    ConfigStore.instance().store(name="memsweep_schema", node=Config)

