"""The keys of where a job runs and what is kept of it: the hardware profile (`hardware`), the measurement
(`measure`), the report's baseline (`report`), the search's objective (`search`) and the processes and
nodes (`distributed`). Apart from schema.py's technique groups: they change where and how a job is
measured, not what it trains; schema.Config holds them beside the others."""
from dataclasses import dataclass, field

from .choices import Device
from .constraints import Count, CountOrZero, Gib, GibOrZero, Positive


@dataclass
class HardwareConf:
    name: str = "auto"
    device: Device = Device.auto
    memory_gib: Gib | None = None  # capacity; null = what the device has
    cuda_context_gib: GibOrZero = 0.0
    bf16: bool = True  # runs at all (on a GPU profile: in hardware; a rule refuses it otherwise)
    fp16: bool = True
    tf32: bool = False
    # Whether bf16 / fp16 matmuls run in hardware or are emulated (~100x slower than fp32 on a CPU without
    # AVX512-BF16/AMX): detected where a job runs (hardware.detect), null until then; emulated warns.
    bf16_native: bool | None = None
    fp16_native: bool | None = None
    tflops: dict[str, Positive] = field(default_factory=dict)  # peak dense matmul TFLOP/s per dtype
    tensor_core_multiple: CountOrZero = 0  # tensor-core shape rule: multiples that make matmuls fast (0 = none)
    # Device memory bandwidth and the host link (PCIe, one direction), GB/s, from the datasheet named in the
    # profile: the roofline's rates (estimate/roofline.py); null on a CPU = measured there at start-up.
    memory_gbs: Positive | None = None
    host_link_gbs: Positive | None = None
    # GPU to GPU inside a node, GB/s one direction per GPU (NVLink where the part has it), from the datasheet
    # named in the profile; null = the host link (PCIe): the ring of several processes' collectives
    # (estimate/collectives.py)
    interconnect_gbs: Positive | None = None
    # major.minor of a CUDA GPU (9.0 = Hopper): null on a CPU; detected on a GPU without a profile
    compute_capability: Positive | None = None
    # streaming multiprocessors of a CUDA GPU (how PyTorch's reduction kernel splits its work, hence the
    # scratch it allocates: estimate/scratch.py): null on a CPU; detected on a GPU without a profile
    sm_count: Count | None = None


@dataclass
class MeasureConf:
    # The memory ledger is taken on these optimizer steps (1-based); their batches are padded to
    # max_seq_len so the figure does not depend on which examples they hold.
    warmup_steps: CountOrZero = 1
    ledger: bool = True
    # Store the estimator's prediction with every real job (results.json "estimate"), so the sweep
    # summary shows predicted vs measured; a trace costs about a second per job.
    estimate: bool = True


@dataclass
class ReportConf:
    baseline: str | None = None  # job index or an override string; null = the first job


@dataclass
class SearchConf:
    # hparams_search=optuna optimises this results.json metric among jobs whose measured peak stays
    # under the budget (GiB); the others are failed trials. null = the task's quality metric (run/task.py),
    # and the direction follows the metric (sweep/search.py).
    metric: str | None = None
    max_peak_gib: Gib | None = None


@dataclass
class DistributedConf:
    nproc: Count = 1  # processes (ranks) per node: torchrun starts them, or Slurm's tasks_per_node
    nodes: Count = 1  # machines of one job: Slurm's nodes, or one torchrun per machine joined at rdzv_endpoint
    # Outside Slurm, with nodes > 1: this machine's place (0 hosts the rendezvous and writes the job's results)
    # and the host:port of node 0's rendezvous, the same on every machine (torchrun's --node-rank, --rdzv-endpoint).
    node_rank: CountOrZero = 0
    rdzv_endpoint: str | None = None
    backend: str = "auto"  # auto = gloo on CPU, nccl on GPU (Accelerate's choice); else TrainingArguments.ddp_backend
    # The network between nodes, GB/s one direction per GPU (a cluster's, not a GPU's: e.g. 400 Gb/s NICs, one
    # per GPU = 50): the collectives' ring across nodes (estimate/collectives.py); null = not timed across nodes
    network_gbs: Positive | None = None

    @property
    def world_size(self) -> int:
        """Ranks of the job, on all its nodes."""
        return self.nodes * self.nproc


