"""hardware=auto: a GPU is matched to its profile by name (KNOWN_GPUS), another GPU gets its detected
properties, and no GPU means the CPU. The CUDA queries are stood in for: the logic runs on the CPU."""
from types import SimpleNamespace

import pytest
import torch

from memsweep import hardware
from memsweep.schema import HardwareConf


def fake_gpu(monkeypatch, name: str, gib: float, major: int, bf16: bool):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name=name, total_memory=int(gib * 2**30), major=major))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)


@pytest.mark.parametrize("name, option", [("Tesla T4", "t4"), ("NVIDIA A10G", "a10g"),
                                          ("NVIDIA A100-SXM4-40GB", "a100_40gb"),
                                          ("NVIDIA A100-SXM4-80GB", "a100_80gb"), ("NVIDIA A100 80GB PCIe", "a100_80gb"),
                                          ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA GeForce RTX 3090", None)])
def test_gpu_names_map_to_their_profile(name, option):
    assert hardware.profile_option(name) == option


def test_auto_on_a_known_gpu_is_its_profile(monkeypatch):
    fake_gpu(monkeypatch, "Tesla T4", 15.1, major=7, bf16=False)
    profile = hardware.detect(HardwareConf())
    t4 = hardware.load_profile("t4")
    assert profile.name == "auto:t4" and profile.device == "cuda"
    assert (profile.memory_gib, profile.bf16, profile.tflops, profile.cuda_context_gib) == \
        (t4.memory_gib, t4.bf16, t4.tflops, t4.cuda_context_gib) == (15.0, False, t4.tflops, 0.4)


def test_auto_on_an_unknown_gpu_takes_its_properties(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA GeForce RTX 3090", 24.0, major=8, bf16=True)
    profile = hardware.detect(HardwareConf())
    assert profile.name == "auto:NVIDIA GeForce RTX 3090" and profile.memory_gib == pytest.approx(24.0)
    assert (profile.bf16, profile.tf32, profile.tensor_core_multiple) == (True, True, 64)


def test_a_named_profile_is_kept_and_no_gpu_means_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hardware.detect(HardwareConf()).name == "auto:cpu"
    t4 = hardware.load_profile("t4")
    assert hardware.detect(t4) == t4  # a profile named on the command line is what the job is asked about
