"""The checks of what a job's keys name, before any work: the model as the job will build it, the data it
will read, the launcher's rendezvous and the profile's rates. config/validate.py checks the keys on their
own (no library, no model); these need the run's own modules, and run in every mode where they apply
(training reads data, an estimate does not). Any error raised inside them is bad input about the key
being checked (errors.naming): never a traceback.
"""
from omegaconf import DictConfig

from ..config import validate_names
from ..config.schema import Config, DataSource, Mode
from ..config.validate import settings
from ..errors import ConfigError, naming
from . import task, validate_model


def job(cfg: DictConfig) -> Config:
    """Every check that applies in the job's mode, cheapest first; the typed job they passed."""
    checked = settings(cfg)
    inputs(checked)
    return checked


def inputs(checked: Config) -> None:
    """What the keys name (schedulers, encodings, modules), the model as it will be built, and for
    training its capacity and the data."""
    validate_names.names(checked)
    tflops(checked.hardware.tflops)
    task_data(checked)
    rendezvous(checked)
    backend(checked)
    validate_model.check_model(checked)
    if checked.mode == Mode.train:
        validate_model.capacity(checked)
        data(checked)


def tflops(rates: dict[str, float]) -> None:
    """The profile's rates are per dtype a precision computes in (techniques/precision.py), each > 0."""
    from ..techniques.precision import TRAITS

    computes = sorted({t.compute for t in TRAITS.values()})
    for dtype, rate in rates.items():
        if dtype not in computes:
            raise ConfigError(f"hardware.tflops.{dtype}", f"{dtype!r} is not a dtype a precision computes in; "
                                                          f"allowed: {', '.join(computes)}")
        if not rate > 0:
            raise ConfigError(f"hardware.tflops.{dtype}", f"{rate} is not allowed; allowed: a number > 0 (TFLOP/s)")


def rendezvous(job: Config) -> None:
    """A training job on several nodes outside Slurm needs the rendezvous every machine's torchrun joins
    (on Slurm the job's node list names it; an estimate joins nothing)."""
    from . import launch

    dist = job.distributed
    if job.mode == Mode.train and dist.nodes > 1 and dist.rdzv_endpoint is None and launch.task_group() is None:
        raise ConfigError("distributed.rdzv_endpoint", f"null is not allowed with distributed.nodes={dist.nodes} "
                                                       "outside Slurm; allowed: host:port of node 0, the same on every "
                                                       "machine, e.g. distributed.rdzv_endpoint=10.0.0.1:29500")


def task_data(job: Config) -> None:
    """The data can feed the task (images to an image task, text to a text task): a fact of the keys alone, so
    every mode refuses it (an estimate of a job that cannot train answers nothing)."""
    if (why := _images_mismatch(job)) is not None:
        raise ConfigError("data", why)


# distributed.backend -> the device its collectives run on (torch.distributed's backends; TrainingArguments'
# ddp_backend choices): xccl Intel GPUs, hccl Ascend/Gaudi, cncl Cambricon, mccl Moore Threads; memsweep trains on
# the CPU or CUDA GPUs only (hardware.device).
BACKEND_DEVICES = {"gloo": ("cpu", "cuda"), "mpi": ("cpu", "cuda"), "nccl": ("cuda",), "xccl": ("xpu",),
                   "hccl": ("npu", "hpu"), "cncl": ("mlu",), "mccl": ("musa",)}


def backend(job: Config) -> None:
    """A training job of several ranks uses a backend this machine can run, before any rank starts (Accelerate
    refuses nccl without CUDA inside each rank, after torchrun started them all)."""
    from ..config.choices import Device

    name = job.distributed.backend
    if job.mode != Mode.train or job.distributed.world_size == 1 or name not in BACKEND_DEVICES:
        return  # one process uses no backend; auto is Accelerate's choice for the device
    import torch

    device = "cuda" if job.hardware.device != Device.cpu and torch.cuda.is_available() else "cpu"
    usable = [b for b, devices in BACKEND_DEVICES.items() if device in devices
              and (b != "mpi" or torch.distributed.is_mpi_available())]
    if name in usable:
        return
    if device in BACKEND_DEVICES[name]:  # mpi: torch built without it
        why = f"{name} is not built into this torch (torch.distributed.is_mpi_available() is False)"
    elif device == "cpu" and job.hardware.device != Device.cpu:
        why = f"{name} needs {' or '.join(BACKEND_DEVICES[name])} and this machine has no CUDA GPU"
    else:
        why = f"{name} needs {' or '.join(BACKEND_DEVICES[name])} and the job trains on {device} (hardware.device=" \
              f"{job.hardware.device.value})"
    raise ConfigError("distributed.backend", f"{why}; allowed: auto (gloo on the CPU, nccl on CUDA GPUs), "
                                             f"{', '.join(usable)}")


def data(job: Config) -> None:
    """What a training job will read, before it loads anything for training: the data's columns, sizes
    and classes (an error of the reader itself is bad input about the data)."""
    from . import data as text

    if task.images(job.task):
        from . import images

        with naming("data", "the digits' sizes"):
            images.split(job.data, job.seed, strict_sizes=True)
        return
    labelled = task.labelled(job.task)
    with naming("data", "a readable .csv, .jsonl or .json file, or hub dataset, with the named columns"):
        train, evaluation, names = text.load_frames(job.data, job.seed, strict_sizes=True, labelled=labelled)
    for split, frame in (("train", train), ("eval", evaluation)) if labelled else ():
        present = sorted(set(frame["label"]))
        if len(present) < 2:
            raise ConfigError("data.label_column", f"the {split} split holds examples of {present} only; "
                                                   f"classification needs at least 2 of the classes {names} in "
                                                   "both splits")


def _images_mismatch(job: Config):
    """Why the data cannot feed the task (images to an image task, text to a text task), or None."""
    reads_images = job.data.source == DataSource.digits
    if task.images(job.task) and not reads_images:
        return (f"data={job.data.name} is text, task=image_classification reads images; allowed: data=digits (the "
                "labelled images that ship with scikit-learn)")
    if reads_images and not task.images(job.task):
        return (f"data={job.data.name} is images, task={job.task.name.value} reads text; allowed: "
                "task=image_classification with data=digits, or a text data set (data=tweets)")
    return None
