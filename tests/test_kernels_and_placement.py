"""attention, init, compile and hardware: what each changes, observed on the built or running job."""
from types import SimpleNamespace

import pytest

from conftest import TINY, build_job, compose_config
from memsweep.config import hardware
from memsweep.config.schema import HardwareConf


def test_eager_attention_holds_more_activation_bytes_than_sdpa(tiny_job, tmp_path):
    def run(*extra):
        sdpa = tiny_job("max_seq_len=128", "max_steps=2", *extra, job_dir=tmp_path / f"sdpa{len(extra)}")
        eager = tiny_job("max_seq_len=128", "max_steps=2", "attention=eager", *extra,
                         job_dir=tmp_path / f"eager{len(extra)}")
        assert (sdpa["effective"]["attention"], eager["effective"]["attention"]) == ("sdpa", "eager")
        return eager["memory"]["activations_bytes"] - sdpa["memory"]["activations_bytes"]

    # Without attention dropout, SDPA's fused CPU kernel does not keep the (batch, heads, seq, seq)
    # probabilities that eager keeps for backward.
    probs_one_layer = 32 * 2 * 128 * 128 * 4
    assert run("model.dropout=0") >= 0.9 * probs_one_layer
    # With dropout, SDPA on the CPU falls back to the math path: no saving at all.
    assert run() == 0


def test_init_on_device_loads_the_weights_straight_onto_the_device(tmp_path, monkeypatch):
    # On the CPU the weights land there either way; on a GPU device_map skips the host copy.
    from transformers import AutoModelForSequenceClassification

    seen = []
    original = AutoModelForSequenceClassification.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.append(kwargs.get("device_map"))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(AutoModelForSequenceClassification, "from_pretrained", classmethod(spy))
    build_job(TINY, tmp_path / "a")
    model = build_job(TINY + ["init=device"], tmp_path / "b").trainer.model
    assert seen == [None, "cpu"] and next(model.parameters()).device.type == "cpu"


def test_compile_wraps_the_model_the_trainer_trains(tiny_job, tmp_path):
    # One step, the ledger's: it runs under MemTracker's dispatch mode, where dynamo does not compile,
    # so this costs seconds; the wrapper Trainer trained through is observed on the finished job.
    on = tiny_job("compile=on", "max_steps=1", "data.eval_size=32", job_dir=tmp_path / "on")
    off = tiny_job("max_steps=1", "data.eval_size=32", job_dir=tmp_path / "off")
    assert (on["status"], off["status"]) == ("ok", "ok")
    assert (on["effective"]["compiled"], off["effective"]["compiled"]) == (True, False)


@pytest.mark.slow  # inductor compiles a training step
def test_a_compiled_job_trains_a_graph_dynamo_captured(tiny_job):
    # The second step is the first outside the ledger: dynamo traces it and inductor compiles it,
    # 45-70 s with one layer on these 2 cores (~10 s once inductor's on-disk cache holds the graph).
    # Its effect is speed, which `make bench` measures.
    import torch._dynamo.utils

    # Dynamo's caches are per process: after an earlier compiled job here (the test above), this
    # job's step was seen to capture nothing at all. Start from a clean dynamo.
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    res = tiny_job("compile=on", "max_steps=2", "model.num_layers=1", "data.eval_size=32")
    assert res["status"] == "ok" and res["effective"]["compiled"] is True
    counters = torch._dynamo.utils.counters
    assert counters["frames"]["ok"] >= 1 and counters["stats"]["unique_graphs"] >= 1, dict(counters["frames"])
    assert counters["aot_autograd"]["ok"] >= 1  # a forward and backward graph: the training step


@pytest.mark.parametrize("gib, device_gib, expected", [(15.0, 40, 15 / 40), (79.2, 80, 79.2 / 80), (40, 16, None),
                                                      (None, 80, None)])
def test_a_larger_gpu_is_capped_to_the_profile(gib, device_gib, expected):
    got = hardware.memory_fraction(gib, device_gib * 2**30)
    assert got == pytest.approx(expected) if expected is not None else got is None


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA device of `gib` GiB as torch.cuda reports it; returns the fractions the code sets."""
    import torch

    fractions = []

    def install(gib):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda device=None: SimpleNamespace(total_memory=int(gib * 2**30)))
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                            lambda fraction, device=None: fractions.append(fraction))
        return fractions

    return install


T4_LIKE = HardwareConf(name="t4", device="cuda", memory_gib=15.0)


def test_a_t4_profile_on_a_40_gib_gpu_caps_the_process_to_15_gib(fake_gpu):
    fractions = fake_gpu(40)
    assert hardware.cap_memory(T4_LIKE) == pytest.approx(15 / 40)
    assert fractions == [pytest.approx(15 / 40)]


@pytest.mark.parametrize("profile, device_gib", [(T4_LIKE, 8), (T4_LIKE, 15),
                                                 (HardwareConf(name="auto", device="cuda", memory_gib=None), 80)])
def test_the_whole_gpu_when_the_profile_is_not_smaller(fake_gpu, profile, device_gib):
    # set to 1.0, not left alone: an earlier job of the same process may have capped it
    fractions = fake_gpu(device_gib)
    assert hardware.cap_memory(profile) is None
    assert fractions == [1.0]


def test_a_cpu_profile_sets_no_gpu_cap(fake_gpu):
    fractions = fake_gpu(40)
    assert hardware.cap_memory(HardwareConf(name="cpu", device="cpu", memory_gib=15.0)) is None
    assert fractions == []


def test_profiles_carry_capabilities():
    t4 = compose_config(["hardware=t4"]).hardware
    a100 = compose_config(["hardware=a100_40gb"]).hardware
    assert (t4.bf16, t4.tf32, t4.memory_gib) == (False, False, 15.0)
    assert (a100.bf16, a100.tf32) == (True, True) and a100.tflops["bf16"] > a100.tflops["fp32"]
    from omegaconf import OmegaConf

    cpu = hardware.detect(OmegaConf.to_object(compose_config([])).hardware)
    assert cpu.device == "cpu" and cpu.name == "auto:cpu"
