"""optim: optimizer state measured from the optimizer, as a share of AdamW's."""
import pytest
import torch

from memsweep.measure.optimizer_state import plain_tensors

# One worker runs the whole module (`make test`: --dist loadgroup), so its module fixture's jobs run once.
pytestmark = pytest.mark.xdist_group("optim")


@pytest.fixture(scope="module")
def by_optim(tmp_path_factory):
    from conftest import TINY, run_job

    out = {}
    for name in ("adamw", "adamw_fused", "adamw_torch", "sgd", "adafactor", "adamw_8bit", "paged_adamw_8bit",
                 "paged_adamw_32bit", "adamw_torch_8bit", "adamw_torch_4bit"):
        out[name] = run_job(TINY + [f"optim={name}", "max_steps=2"], tmp_path_factory.mktemp(name))
    return out


def test_every_optimizer_runs_and_is_the_one_asked_for(by_optim):
    seen = {k: (r["status"], r["effective"]["optimizer"]) for k, r in by_optim.items()}
    # transformers builds both 8-bit variants as bitsandbytes' AdamW(optim_bits=8, is_paged=...)
    assert seen == {"adamw": ("ok", "AdamW"), "adamw_fused": ("ok", "AdamW"), "adamw_torch": ("ok", "AdamW"),
                    "sgd": ("ok", "SGD"), "adafactor": ("ok", "Adafactor"), "adamw_8bit": ("ok", "AdamW"),
                    "paged_adamw_8bit": ("ok", "AdamW"), "paged_adamw_32bit": ("ok", "AdamW"),
                    "adamw_torch_8bit": ("ok", "AdamW8bit"), "adamw_torch_4bit": ("ok", "AdamW4bit")}


def test_the_default_adamw_steps_with_the_fused_kernel(by_optim):
    # Trainer's own default (adamw_torch_fused); adamw_torch is torch's default kernel: a loop on the CPU
    kernels = {k: r["effective"]["optimizer_kernel"] for k, r in by_optim.items()}
    assert kernels == {"adamw": "fused", "adamw_fused": "fused", "adamw_torch": "for-loop", "sgd": "for-loop",
                       "adafactor": None, "adamw_8bit": None, "paged_adamw_8bit": None,
                       "paged_adamw_32bit": None, "adamw_torch_8bit": None, "adamw_torch_4bit": None}


def test_adamw_state_is_two_fp32_copies_of_the_trainable_parameters(by_optim):
    res = by_optim["adamw"]
    expected = 2 * 4 * res["effective"]["trainable_params"]
    assert expected <= res["memory"]["optimizer_bytes"] <= expected * 1.001  # + one step counter per tensor


def test_optimizer_state_as_a_share_of_adamw(by_optim):
    adamw = by_optim["adamw"]["memory"]["optimizer_bytes"]
    share = {k: r["memory"]["optimizer_bytes"] / adamw for k, r in by_optim.items()}
    assert share["sgd"] == 0  # momentum 0: no state at all
    assert share["adafactor"] < 0.05  # factored second moments
    # Whole model: transformers keeps nn.Embedding weights at 32-bit state (see the next test), and the
    # tiny model is mostly embedding, so the saving is small here; it is 8-bit everywhere else.
    assert share["adamw_8bit"] < 1 and share["paged_adamw_8bit"] == pytest.approx(share["adamw_8bit"], rel=1e-3)
    assert share["adamw_fused"] == share["adamw_torch"] == 1.0  # same state, other kernels
    # bitsandbytes' 32-bit AdamW (paged on a GPU; on the CPU it says it falls back to plain memory): Adam's
    # two fp32 moments, within its per-tensor step bookkeeping
    assert share["paged_adamw_32bit"] == pytest.approx(1.0, rel=1e-3)


def test_adamw_step_temporaries_are_not_counted_as_optimizer_state(tiny_job, tmp_path):
    # At micro-batch 1 the peak is in the optimizer step, where torch's unfused CPU AdamW allocates two
    # temporaries as big as the largest parameter (the embedding: sqrt of its second moment, then
    # that divided by the bias correction); the fused kernel allocates neither, so its peak is about
    # one embedding lower. The ledger reports them as temporaries, not as optimizer state.
    embedding_bytes = 30522 * 64 * 4
    mem = {}
    for optim in ("adamw_torch", "adamw"):
        res = tiny_job("accumulation=x32", "max_steps=2", f"optim={optim}", job_dir=tmp_path / optim)
        mem[optim] = res["memory"]
        assert res["memory"]["optimizer_bytes"] == res["effective"]["optimizer_state_bytes"]
        assert res["memory"]["peak_breakdown"]["optimizer"] == res["memory"]["optimizer_bytes"]
    assert mem["adamw_torch"]["temp_bytes"] >= 2 * embedding_bytes > mem["adamw"]["temp_bytes"]
    assert mem["adamw_torch"]["peak_bytes"] - mem["adamw"]["peak_bytes"] == pytest.approx(embedding_bytes, rel=0.01)


def test_the_trace_of_each_optimizers_step_is_its_measured_peak_and_state(by_optim):
    # torchao's compiled step runs eager in both (the ledger step and the fake trace run under dispatch modes)
    for name, res in by_optim.items():
        est, mem = res["estimate"], res["memory"]
        assert est["optimizer_bytes"] == mem["optimizer_bytes"], name
        assert est["peak_bytes"] == pytest.approx(mem["peak_bytes"], rel=0.01), name


@pytest.mark.parametrize("name, bits", [("adamw_torch_8bit", 8), ("adamw_torch_4bit", 4)])
def test_torchao_state_is_low_bit_where_a_tensor_fills_whole_blocks(tmp_path, name, bits):
    # torchao quantizes a moment when its tensor has 4,096 values or more in whole blocks (Trainer's block
    # size, 256), each block with one fp32 scale; any other tensor keeps fp32 moments (AdamW's bytes)
    from conftest import TINY, build_job

    built = build_job(TINY + [f"optim={name}", "max_steps=1", "measure.ledger=false"], tmp_path)
    built.trainer.train()
    optimizer = built.trainer.optimizer.optimizer
    quantized = 0
    for param, state in optimizer.state.items():
        held = sum(t.untyped_storage().nbytes() for v in state.values() for t in plain_tensors(v))
        adam = 2 * 4 * param.numel()
        if param.numel() >= 4096 and param.numel() % 256 == 0:
            # codes (bits per value), a scale per block, each moment's 256- or 16-entry map, the step count
            codes_and_scales = 2 * param.numel() * (bits / 8 + 4 / 256)
            assert codes_and_scales < held <= codes_and_scales + 2 * 4 * 256 + 4, (tuple(param.shape), held / adam)
            quantized += 1
        else:
            assert held == adam + 4, tuple(param.shape)  # + the step count
    assert quantized >= 4


@pytest.mark.parametrize("name", ["adamw_8bit", "paged_adamw_8bit"])
def test_8bit_state_is_a_quarter_of_adams_except_embeddings(tmp_path, name):
    from conftest import TINY, build_job

    built = build_job(TINY + [f"optim={name}", "max_steps=1", "measure.ledger=false"], tmp_path)
    built.trainer.train()
    optimizer = built.trainer.optimizer.optimizer
    assert optimizer.args.optim_bits == 8 and optimizer.is_paged == ("paged" in name)
    embeddings = {id(m.weight) for m in built.trainer.model.modules() if isinstance(m, torch.nn.Embedding)}
    quantized = 0
    for param, state in optimizer.state.items():
        held = sum(v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v))
        adam = 2 * 4 * param.numel()
        if id(param) in embeddings:  # transformers' choice, for stability: 32-bit state
            assert held == adam
        elif param.numel() >= 8192:  # 8-bit from 4096 on; below ~8k the fixed quantisation maps weigh in
            assert abs(held / adam - 0.25) <= 0.05, (tuple(param.shape), held / adam)
            quantized += 1
    assert quantized >= 4


def test_a_traced_step_starts_holding_torchao_state_as_the_optimizer_holds_it():
    # the allocator model's step starts with the state made by the first step: a low-bit moment is a
    # wrapper whose codes, scales and map hold the memory (a wrapper itself holds none)
    from torchao.optim import AdamW4bit

    from memsweep.estimate import capture
    from memsweep.measure.optimizer_state import optimizer_state_bytes

    model = torch.nn.Linear(512, 64)
    optimizer = AdamW4bit(model.parameters(), lr=1e-3)
    model(torch.ones(2, 512)).sum().backward()
    with torch.compiler.set_stance("force_eager"):
        optimizer.step()
    held = sum(t.untyped_storage().nbytes() for category, t in capture.alive_at_step(model, optimizer)
               if category == "optimizer")
    assert held == optimizer_state_bytes(optimizer) < 2 * 4 * 512 * 64 / 6
