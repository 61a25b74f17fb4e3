"""Fixed-shape training steps on CUDA in a plain loop (no Trainer): the wall time of a step (synchronised after
each, and over ten unsynchronised ones) and the GPU's kernel time in it (torch.profiler), so what the GPU takes
and what the host's dispatch of the ops takes can be told apart.

    python benchmarks/gpu_step_profile.py OUT.json

bert-base's shape (fp32, bf16 and fp16 autocast), the 2-layer 64-wide BERT, and the 0.48B Llama-style decoder
of gpu_check.py, random weights, 32 x 128 tokens, fused AdamW, clipping. `kernel_ms` sums the profiler's CUDA
events, which include the optimizer's GPU annotation range (`Optimizer.step#AdamW.step`, listed in
`top_kernels_ms`) beside its kernels. Figures of an H200: benchmarks/gpu_snapshots/h200_step_profile.json
(its decoder rows are named llama-0.2b there, the name the script gave it then; 477,374,464 parameters).
"""
import json
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

dev = "cuda" if torch.cuda.is_available() else "cpu"
BERT = dict(model_type="bert", hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            vocab_size=30522)
TINY = dict(model_type="bert", hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            vocab_size=30522)
LLAMA = dict(model_type="llama", hidden_size=2048, num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=4,
             intermediate_size=5632, vocab_size=30522)
CASES = [("bert-base", BERT, "fp32"), ("bert-base", BERT, "bf16-mixed"), ("bert-base", BERT, "fp16-mixed"),
         ("tiny", TINY, "fp32"), ("tiny", TINY, "bf16-mixed"), ("llama-0.48b", LLAMA, "bf16-mixed")]
B, T = 32, 128


def build(spec):
    kind = dict(spec)
    config = AutoConfig.for_model(kind.pop("model_type"), **kind)
    config._attn_implementation = "sdpa"
    auto = AutoModelForCausalLM if config.model_type == "llama" else AutoModelForSequenceClassification
    return auto.from_config(config).to(dev).train()


def training_step(name, spec, precision):
    """(the model, a closure running one step: forward, backward, clipping, fused AdamW)."""
    torch.manual_seed(0)
    model = build(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=dev == "cuda")
    ids = torch.randint(0, 30000, (B, T), device=dev)
    labels = ids if name.startswith("llama") else torch.randint(0, 2, (B,), device=dev)
    dtype = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(dev) if dtype == torch.float16 else None

    def step():
        with torch.autocast(dev, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(input_ids=ids, labels=labels).loss
        if scaler:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step


def wall_s(step, sync) -> tuple[float, float]:
    """(median seconds of a step synchronised after it, mean of ten unsynchronised ones: the host runs ahead,
    the queue fills, the steady-state interval), after three warm-up steps."""
    for _ in range(3):
        step()
    sync()
    walls = []
    for _ in range(10):
        start = time.perf_counter()
        step()
        sync()
        walls.append(time.perf_counter() - start)
    sync()
    start = time.perf_counter()
    for _ in range(10):
        step()
    sync()
    return statistics.median(walls), (time.perf_counter() - start) / 10


def kernels_of(step, sync) -> dict:
    """The profiler's CUDA events over three steps, per step: their total time, count and largest names."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(3):
            step()
        sync()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_us = sum(e.device_time for e in kernels) / 3 if kernels else None
    key_total_us = sum(e.self_device_time_total for e in prof.key_averages()) / 3
    aten = [e for e in prof.events() if e.name.startswith("aten::") and e.device_type == torch.autograd.DeviceType.CPU]
    by_name = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time / 3
    return {"kernel_ms": kernel_us / 1e3 if kernel_us else None, "kernels_per_step": len(kernels) / 3,
            "self_device_ms_by_key": key_total_us / 1e3, "aten_calls_per_step": len(aten) / 3,
            "top_kernels_ms": {k[:90]: round(v / 1e3, 3)
                               for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:12]}}


def run(name, spec, precision):
    model, step = training_step(name, spec, precision)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    synced, pipelined = wall_s(step, sync)
    out = {"case": name, "precision": precision, "batch": B, "seq": T, "wall_ms_sync": 1e3 * synced,
           "wall_ms_pipelined": 1e3 * pipelined, **kernels_of(step, sync),
           "params": sum(p.numel() for p in model.parameters())}
    del model, step
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


results = []
for case in CASES if dev == "cuda" else CASES[3:5]:
    try:
        results.append(run(*case))
    except Exception as exc:  # noqa: BLE001
        results.append({"case": case[0], "precision": case[2], "error": repr(exc)[:300]})
    print(json.dumps(results[-1]), flush=True)
    json.dump(results, open(sys.argv[1], "w"), indent=1)
