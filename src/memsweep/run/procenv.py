"""The process environment a job runs in: set-up once per process, a process group of one for a job
that needs it, and the teardown that leaves the process clean for the next job of a sweep.

Only this module changes `os.environ` for a job. Building a Setup has no side effects: a technique
that needs torch.distributed (DeepSpeed, FSDP) says so in `setup.process_group`, and the job enters
the group here when it builds its Trainer.
"""
import gc
import os
import socket
import sys

# The environment before this process made its own group; Trainer and Accelerate add variables
# (ACCELERATE_USE_DEEPSPEED, ...) that would make the next job of a sweep think it is distributed.
_ENV_BEFORE: dict[str, str] | None = None
_GROUP_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# The caching allocator's settings: c10's AllocatorConfig reads PYTORCH_ALLOC_CONF, else the older
# PYTORCH_CUDA_ALLOC_CONF. The process's own value (None: unset), kept before a job changes it.
ALLOC_CONF_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
EXPANDABLE = "expandable_segments:True"
_ALLOC_CONF_BEFORE: tuple[str, str | None] | None = None


def prepare() -> None:
    """Defaults every job of the process runs with, before transformers or DeepSpeed are imported."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # else tokenizers warns after every fork
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import torch

    if not torch.cuda.is_available():  # else DeepSpeed probes for accelerators and warns on every import
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def alloc_conf_for(expandable_segments: bool, conf: str | None) -> str | None:
    """The allocator settings a job runs with: `conf` (the process's), with expandable_segments:True in place
    of any expandable_segments it says when the job's `expandable_segments` key is on; else `conf` as it is."""
    if not expandable_segments:
        return conf
    items = [i for i in (conf or "").split(",") if i.strip() and not i.strip().startswith("expandable_segments")]
    return ",".join([*items, EXPANDABLE])


def use_allocator(job) -> None:
    """The job's allocator settings in this process's environment (and its ranks', which inherit it): set
    before CUDA is initialised, where the allocator reads them; where an earlier job of the process has
    initialised CUDA already, handed to the allocator itself (c10's setAllocatorSettings, which applies to the
    segments it maps from then on). A job with the key off runs with the process's own value."""
    global _ALLOC_CONF_BEFORE
    if _ALLOC_CONF_BEFORE is None:
        name = next((v for v in ALLOC_CONF_VARIABLES if v in os.environ), ALLOC_CONF_VARIABLES[1])
        _ALLOC_CONF_BEFORE = (name, os.environ.get(name))
    name, before = _ALLOC_CONF_BEFORE
    conf = alloc_conf_for(job.expandable_segments, before)
    if conf is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = conf
    import torch

    if torch.cuda.is_initialized():
        torch._C._accelerator_setAllocatorSettings(f"expandable_segments:{EXPANDABLE in (conf or '')}")


def use_threads(threads) -> None:
    """The job's torch thread count (`threads`; none: torch's own), set before its estimate measures this CPU's
    rates (measure/peak.py) and before it trains: both at the same count."""
    import torch

    if threads:
        torch.set_num_threads(threads)


def settle_imports() -> None:
    """Move what is alive now (mostly the millions of objects torch, transformers and the rest made as they
    were imported) out of the cyclic collector's reach, once the job's libraries are loaded: the collections
    a job makes (Accelerate's free_memory, the job's end) then walk only the job's own objects, about 0.7 s
    fewer each on this CPU. Python's gc.freeze documents this use. What is garbage now is collected first;
    what is frozen and dies later is freed by its reference count, though a cycle among frozen objects is
    not (the libraries' own objects live as long as the process; a sweep's earlier jobs leave little)."""
    gc.collect()
    gc.freeze()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def enter_group_of_one() -> None:
    """DeepSpeed and FSDP need a process group even alone; without a launcher, make it a group of one."""
    global _ENV_BEFORE
    if "WORLD_SIZE" in os.environ:  # torchrun / srun / deepspeed launcher already set it
        return
    _ENV_BEFORE = dict(os.environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")


def without_group_variables() -> dict[str, str]:
    """This environment for child processes that make their own group (torchrun's ranks)."""
    return {k: v for k, v in os.environ.items() if k not in _GROUP_VARIABLES}


def teardown() -> None:
    """Destroy a group this job made and reset Accelerate's singletons, so the next job starts clean."""
    global _ENV_BEFORE
    if _ENV_BEFORE is None:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(_ENV_BEFORE)
    _ENV_BEFORE = None
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()
    _forget_deepspeed()


def _forget_deepspeed() -> None:
    """DeepSpeed caches the process groups (and its comm backend) in module globals, transformers its ZeRO
    config, and ZeRO-3's zero.Init puts its own torch.nn.functional.linear in place ("This will persist unless
    manually reset", partition_parameters.py): none of them may leak into the next job of the same process
    (that linear saves other tensors for backward: the next job would measure and trace another step)."""
    hf_deepspeed = sys.modules.get("transformers.integrations.deepspeed")
    if hf_deepspeed is not None:  # else the next from_pretrained builds its model under ZeRO-3's zero.Init
        hf_deepspeed.unset_hf_deepspeed_config()
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is not None:
        for name in [n for n in vars(groups) if n.startswith("_") and n.isupper() and ("GROUP" in n or "MPU" in n)]:
            setattr(groups, name, {} if isinstance(getattr(groups, name), dict) else None)
    comm = sys.modules.get("deepspeed.comm.comm")
    if comm is not None:
        comm.cdb = None
    zero = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    linear = getattr(getattr(zero, "InsertPostInitMethodToModuleSubClasses", None), "linear_bk", None)
    if linear is not None:  # torch's own, which zero.Init kept before replacing it
        import torch

        torch.nn.functional.linear = linear
