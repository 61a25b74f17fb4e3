"""Process-wide counters: NVML's "used" by this process on the job's own GPU (found by PCI address),
nothing invented without CUDA. NVML and the CUDA queries are stood in for: the logic runs on the CPU."""
import os
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from memsweep.measure import counters


def fake_nvml(monkeypatch, used: int, processes=None) -> list:
    """`used`: this process's figure in NVML's process list (or, with processes=[], the v2 device figure;
    the v1 device figure, which counts the driver's reservation, is 1 GiB more and must not be read)."""
    asked = []
    nvml = ModuleType("pynvml")
    nvml.nvmlMemory_v2 = 0x02000028
    nvml.nvmlInit = lambda: asked.append("init")
    nvml.nvmlShutdown = lambda: asked.append("shutdown")
    nvml.nvmlDeviceGetHandleByPciBusId = lambda bus: asked.append(bus) or bus
    listed = [SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=7 * 2**30),
              SimpleNamespace(pid=os.getpid(), usedGpuMemory=used)] if processes is None else processes
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda handle: listed
    nvml.nvmlDeviceGetMemoryInfo = lambda handle, version=None: SimpleNamespace(
        used=used if version == nvml.nvmlMemory_v2 else used + 2**30, total=16 * 2**30)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return asked


@pytest.mark.fast
def test_used_is_read_from_the_jobs_own_gpu(monkeypatch):
    asked = fake_nvml(monkeypatch, used=5 * 2**30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    props = {1: SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0)}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    assert counters.device_used() == 5 * 2**30
    assert asked == ["init", "00000000:3B:00.0", "shutdown"]  # NVML is shut down again


def test_outside_nvmls_process_list_the_device_figure_without_the_drivers_reservation(monkeypatch):
    fake_nvml(monkeypatch, used=3 * 2**30, processes=[])  # a container: NVML lists host PIDs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(pci_domain_id=0, pci_bus_id=1, pci_device_id=0))
    assert counters.device_used() == 3 * 2**30


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


def test_the_peak_used_is_the_peak_reserved_plus_what_the_allocator_does_not_hold(monkeypatch):
    """NVML reads the present: after Trainer emptied the cache "used" is below its peak, which is the
    allocator's peak plus the context and libraries beside it."""
    fake_nvml(monkeypatch, used=5 * 2**30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(pci_domain_id=0, pci_bus_id=1, pci_device_id=0))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 4 * 2**30)  # the cache partly emptied
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 9 * 2**30)
    assert counters.device_used_peak() == (10 * 2**30, 2**30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert counters.device_used_peak() == (None, None)
