"""hardware=auto: a GPU is matched to its profile by name (KNOWN_GPUS), another GPU gets its detected
properties, and no GPU means the CPU. The CUDA queries are stood in for: the logic runs on the CPU."""
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from memsweep.config import hardware
from memsweep.config.schema import HardwareConf
from memsweep.techniques import precision


def fake_gpu(monkeypatch, name: str, gib: float, major: int, bf16: bool, minor: int = 6):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name=name, total_memory=int(gib * 2**30), major=major,
                                                            minor=minor, multi_processor_count=68))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)


@pytest.mark.parametrize("name, option", [("Tesla T4", "t4"), ("NVIDIA A10G", "a10g"),
                                          ("NVIDIA A100-SXM4-40GB", "a100_40gb"),
                                          ("NVIDIA A100-SXM4-80GB", "a100_80gb"),
                                          ("NVIDIA A100 80GB PCIe", "a100_80gb"),
                                          ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                          ("NVIDIA GeForce RTX 3090", "rtx3090"),
                                          ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA L4", "l4"),
                                          ("NVIDIA L40S", None), ("NVIDIA GeForce RTX 3080", None)])
def test_gpu_names_map_to_their_profile(name, option):
    assert hardware.profile_option(name) == option


@pytest.mark.fast
def test_auto_on_a_known_gpu_is_its_profile(monkeypatch):
    fake_gpu(monkeypatch, "Tesla T4", 15.1, major=7, bf16=False)
    profile = hardware.detect(HardwareConf())
    t4 = hardware.load_profile("t4")
    assert profile.name == "auto:t4" and profile.device == "cuda"
    assert (profile.memory_gib, profile.bf16, profile.tflops, profile.cuda_context_gib) == \
        (t4.memory_gib, t4.bf16, t4.tflops, t4.cuda_context_gib) == (15.0, False, t4.tflops, 0.14)


def test_auto_on_an_unknown_gpu_takes_its_properties(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA GeForce RTX 3080", 10.0, major=8, bf16=True)
    profile = hardware.detect(HardwareConf())
    assert profile.name == "auto:NVIDIA GeForce RTX 3080" and profile.memory_gib == pytest.approx(10.0)
    assert (profile.bf16, profile.tf32, profile.tensor_core_multiple) == (True, True, 64)
    assert profile.compute_capability == pytest.approx(8.6)  # picks the cuBLAS workspace the trace replays
    assert profile.sm_count == 68  # sizes the reductions' scratch (estimate/scratch.py)


@pytest.mark.fast
def test_a_named_profile_is_kept_and_no_gpu_means_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hardware.detect(HardwareConf()).name == "auto:cpu"
    t4 = hardware.load_profile("t4")
    # a profile named on the command line is what the job is asked about; what it runs natively is filled in
    assert hardware.detect(t4) == replace(t4, bf16_native=False, fp16_native=True)


def test_a_cpu_without_native_bf16_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: False)
    profile = hardware.detect(HardwareConf())
    assert (profile.bf16, profile.bf16_native, profile.fp16_native) == (True, False, False)  # runs, emulated
    assert [precision.emulated(p, profile) for p in ("fp32", "bf16", "fp16", "bf16_true")] == [None, "bf16", "fp16",
                                                                                                "bf16"]
    assert hardware.sweep_precisions() == ["fp32"]
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    native = hardware.detect(HardwareConf())
    assert native.bf16_native and precision.emulated("bf16", native) is None
    assert hardware.sweep_precisions() == ["fp32", "bf16"]


def test_a_gpu_profile_is_native_in_what_it_supports(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    t4 = hardware.detect(hardware.load_profile("t4"))  # estimated here: the profile speaks for the GPU
    assert (t4.fp16_native, t4.bf16_native) == (True, False) and precision.emulated("fp16", t4) is None


@pytest.mark.parametrize("native", [False, True])
def test_an_emulated_precision_warns_once_and_is_recorded(native, tmp_path, capsys, monkeypatch):
    from conftest import TINY, run_job

    monkeypatch.setattr(hardware, "cpu_native_precisions", lambda: (native, native))
    res = run_job(TINY + ["precision=bf16", "max_steps=1", "data.eval_size=16"], tmp_path / "job")
    warnings = [line for line in capsys.readouterr().out.splitlines() if "is emulated on" in line]
    assert res["status"] == "ok" and res["hardware"]["bf16_native"] is native
    assert res["effective"]["emulated_precision"] == (None if native else "bf16")
    assert len(warnings) == (0 if native else 1)


def test_the_sweep_summary_marks_emulated_times(tmp_path):
    import json

    from memsweep.run import results
    from memsweep.sweep import report
    from test_report import make_sweep, ok_results

    sweep = make_sweep(tmp_path / "sweep", {0: (1.0, 100.0, 0.85), 1: (0.75, 500.0, 0.84)},
                       grid=["precision=fp32,bf16", "model=tiny"])
    for num, dtype in ((0, None), (1, "bf16")):
        res = ok_results(json.loads((sweep / str(num) / "results.json").read_text())["overrides"], 1.0, 100.0, 0.85)
        res["effective"]["emulated_precision"] = dtype
        results.write(sweep / str(num) / "results.json", res)
    table = report.build(sweep).markdown
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert "time" in rows[0] and "emulated bf16: time not representative" in rows[2] and "emulated" not in rows[1]


def test_every_shipped_profile_keeps_its_declared_bounds():
    """Each conf/hardware/*.yaml as the command line's `hardware.*` keys are checked (a plan loads them by name)."""
    from memsweep.config.schema import CONF_DIR

    names = sorted(p.stem for p in (CONF_DIR / "hardware").glob("*.yaml"))
    assert len(names) >= 10 and all(hardware.load_profile(name).name for name in names)


@pytest.mark.parametrize("line, key", [("memory_gbs: 0", "hardware.memory_gbs"),
                                       ("memory_gib: .inf", "hardware.memory_gib"),
                                       ("tflops: {bf16: -1}", "hardware.tflops"),
                                       ("memory_bandwith: 900", "hardware=broken")])
def test_a_broken_profile_is_refused_naming_the_key_and_its_file(monkeypatch, tmp_path, line, key):
    from memsweep.config import schema
    from memsweep.errors import ConfigError

    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "broken.yaml").write_text(f"name: broken\ndevice: cuda\n{line}\n")
    monkeypatch.setattr(schema, "CONF_DIR", tmp_path)
    with pytest.raises(ConfigError) as refused:
        hardware.load_profile("broken")
    assert refused.value.key == key and "broken.yaml" in str(refused.value), str(refused.value)
