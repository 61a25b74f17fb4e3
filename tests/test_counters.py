"""Process-wide counters: NVML's "used" on the job's own GPU (found by PCI address), nothing invented
without CUDA. NVML and the CUDA queries are stood in for: the logic runs on the CPU."""
import sys
from types import ModuleType, SimpleNamespace

import torch

from memsweep import counters


def fake_nvml(monkeypatch, used: int) -> list:
    asked = []
    nvml = ModuleType("pynvml")
    nvml.nvmlInit = lambda: asked.append("init")
    nvml.nvmlShutdown = lambda: asked.append("shutdown")
    nvml.nvmlDeviceGetHandleByPciBusId = lambda bus: asked.append(bus) or bus
    nvml.nvmlDeviceGetMemoryInfo = lambda handle: SimpleNamespace(used=used, total=16 * 2**30)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return asked


def test_used_is_read_from_the_jobs_own_gpu(monkeypatch):
    asked = fake_nvml(monkeypatch, used=5 * 2**30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    props = {1: SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0)}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    assert counters.device_used() == 5 * 2**30
    assert asked == ["init", "00000000:3B:00.0", "shutdown"]  # NVML is shut down again


def test_no_cuda_no_figure(monkeypatch):
    asked = fake_nvml(monkeypatch, used=1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert counters.device_used() is None and counters.cuda_peaks() == (None, None) and asked == []


def test_an_nvml_failure_is_an_unknown_figure(monkeypatch):
    fake_nvml(monkeypatch, used=1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace())  # no PCI fields
    assert counters.device_used() is None


def test_a_refused_job_loads_no_torch_to_ask(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")
    assert counters.cuda_peaks() == (None, None) and counters.device_used() is None
