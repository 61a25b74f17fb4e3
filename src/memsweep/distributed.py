"""torch.distributed for one job: a one-process group for DeepSpeed on a single machine, and teardown."""
import os
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_process_env() -> None:
    """DeepSpeed needs a process group even alone; without a launcher, make it a group of one."""
    if "WORLD_SIZE" in os.environ:  # torchrun / srun / deepspeed launcher already set it
        return
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")
    os.environ["_MEMSWEEP_OWNS_GROUP"] = "1"


def teardown() -> None:
    """Destroy a group this job made and reset Accelerate's singletons, so the next job starts clean."""
    import torch.distributed as dist

    if os.environ.pop("_MEMSWEEP_OWNS_GROUP", None) is None:
        return
    if dist.is_initialized():
        dist.destroy_process_group()
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        os.environ.pop(var, None)
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()
