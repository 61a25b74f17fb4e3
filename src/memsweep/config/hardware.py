"""Hardware profiles: what a device can do (memory, dtypes, peak TFLOP/s), and detection for `hardware=auto`."""
import os
import re
import sys
from dataclasses import asdict, replace

import torch

from ..errors import ConfigError, naming
from . import constraints
from .schema import HardwareConf

# GPU name fragment (as torch.cuda.get_device_name reports it) -> profile option in conf/hardware/,
# for `hardware=auto`; the longest fragment that matches wins ("A100 80GB" before "A100").
KNOWN_GPUS = {"T4": "t4", "A10G": "a10g", "A100-SXM4-80GB": "a100_80gb", "A100 80GB": "a100_80gb",
              "A100": "a100_40gb", "H100": "h100", "H200": "h200", "RTX 3090": "rtx3090", "RTX 4090": "rtx4090",
              "L4": "l4"}


def profile_option(gpu_name: str) -> str | None:
    """The conf/hardware option of a GPU, from its name; None for a GPU without a profile."""
    for fragment in sorted(KNOWN_GPUS, key=len, reverse=True):
        # whole words only: "L4" is not "L40S"
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(fragment)}(?![A-Za-z0-9])", gpu_name):
            return KNOWN_GPUS[fragment]
    return None


def load_profile(option: str) -> HardwareConf:
    """A shipped profile (conf/hardware/<option>.yaml), checked as the command line's `hardware.*` keys are."""
    from omegaconf import OmegaConf

    from .schema import CONF_DIR

    path = CONF_DIR / "hardware" / f"{option}.yaml"
    with naming(f"hardware={option}", f"a profile whose keys are HardwareConf's (schema.py), in {path}"):
        profile = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(HardwareConf), OmegaConf.load(path)))
    try:
        constraints.check(HardwareConf, asdict(profile), prefix="hardware.")
    except ConfigError as exc:
        raise ConfigError(exc.key, f"{str(exc).removeprefix(exc.key + ': ')} (conf/hardware/{option}.yaml)") from None
    return profile


def this_machine() -> str:
    """The profile option of this machine's device: its CUDA card's (matched by name), else the CPU's."""
    import torch

    if torch.cuda.is_available():
        return profile_option(torch.cuda.get_device_name()) or "a CUDA card without a profile"
    return "cpu"


def is_this_machine(option: str) -> bool:
    """Whether a job on the profile runs here as it would there: the CPU's profile, or the present card's."""
    return option in ("cpu", this_machine())


def cpu_native_precisions() -> tuple[bool, bool]:
    """(bf16, fp16): whether this CPU runs them in hardware. torch's own check is what decides whether
    oneDNN uses bf16/fp16 kernels (AVX512-BF16, AMX, AVX512-FP16) or emulates them; without it, the
    CPU's flags."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()), bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        flags = set()
        if os.path.exists("/proc/cpuinfo"):
            with open("/proc/cpuinfo") as f:
                flags = {flag for line in f if line.startswith("flags") for flag in line.split(":", 1)[1].split()}
        return bool(flags & {"avx512_bf16", "amx_bf16"}), bool(flags & {"avx512_fp16", "amx_fp16"})


def detect(cfg: HardwareConf) -> HardwareConf:
    """Resolve `device: auto` to the real device and fill what the profile leaves open. On a GPU with a
    profile (KNOWN_GPUS) `hardware=auto` is that profile; on another GPU, its detected properties. A CPU
    gets its native bf16/fp16 detected; a GPU profile's are what it supports."""
    cuda = torch.cuda.is_available()
    device = str(cfg.device) if cfg.device != "auto" else ("cuda" if cuda else "cpu")  # plain text from here on
    if cfg.name != "auto":
        profile = replace(cfg, device=device)
    elif device == "cuda":
        props = torch.cuda.get_device_properties(0)
        if (option := profile_option(props.name)) is not None:
            profile = replace(load_profile(option), name=f"auto:{option}", device="cuda")
        else:
            profile = replace(cfg, name=f"auto:{props.name}", device="cuda", memory_gib=props.total_memory / 2**30,
                              bf16=torch.cuda.is_bf16_supported(), fp16=True, tf32=props.major >= 8,
                              tensor_core_multiple=64 if props.major >= 8 else 8,
                              compute_capability=props.major + props.minor / 10, sm_count=props.multi_processor_count)
    else:
        profile = replace(cfg, name="auto:cpu", device="cpu", bf16=True, fp16=True, tf32=False)
    if profile.device == "cpu":
        bf16, fp16 = cpu_native_precisions()
    else:
        bf16, fp16 = profile.bf16, profile.fp16
    return replace(profile, bf16_native=bf16 if profile.bf16_native is None else profile.bf16_native,
                   fp16_native=fp16 if profile.fp16_native is None else profile.fp16_native)


def sweep_precisions() -> list[str]:
    """The precision axis of `make sweep` on this machine: fp32, and bf16 where it runs natively (an
    emulated bf16 job is ~100x slower and its times say nothing about a GPU)."""
    bf16, _ = cpu_native_precisions() if not torch.cuda.is_available() else (torch.cuda.is_bf16_supported(), True)
    return ["fp32", "bf16"] if bf16 else ["fp32"]


def memory_fraction(profile_gib: float | None, device_bytes: int) -> float | None:
    """The share of a device that leaves a job exactly the profile's capacity, or None if no cap is needed."""
    if profile_gib is None:
        return None
    fraction = profile_gib * 2**30 / device_bytes
    return fraction if fraction < 1.0 else None


def cap_memory(profile: HardwareConf) -> float | None:
    """On a GPU larger than the profile, cap this process to the profile's capacity ("would it fit a T4?")."""
    if profile.device != "cuda" or not torch.cuda.is_available():
        return None
    fraction = memory_fraction(profile.memory_gib, torch.cuda.get_device_properties(0).total_memory)
    torch.cuda.set_per_process_memory_fraction(fraction if fraction is not None else 1.0)
    return fraction


if __name__ == "__main__":  # `python -m memsweep.config.hardware sweep-precisions`: the Makefile's precision axis
    if sys.argv[1:] != ["sweep-precisions"]:
        sys.exit("usage: python -m memsweep.config.hardware sweep-precisions")
    chosen = sweep_precisions()
    why = "bf16 runs natively here" if "bf16" in chosen else "bf16 is emulated on this machine: no native bf16 matmuls"
    print(f"[memsweep] precision axis: {','.join(chosen)} ({why})", file=sys.stderr)
    print(",".join(chosen))
