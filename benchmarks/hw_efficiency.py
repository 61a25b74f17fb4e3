"""Hardware efficiency: training FLOP/s against the matmul ceiling of the same dtype, in one process.

- Ceiling: a large square `torch.mm` in that dtype, timed here (median rate of repeated calls).
- Training: one fixed-shape step (batch x seq_len tokens, all real, no padding) of forward,
  backward, clipping and AdamW, the same step as the overhead arms; FLOPs counted once with
  `torch.utils.flop_counter.FlopCounterMode`, time = median of the timed steps.
- `--profile-below F`: if fp32 efficiency is below F, profile a few fp32 steps with torch.profiler
  and write where the time goes (top ops by self CPU time, matmul vs the rest, per phase).

Writes one JSON object (numbers and the markdown analysis) to --out, or prints it.
"""
import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForSequenceClassification

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Ops the matmul ceiling speaks for (profiler names); everything else is "the rest".
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
              "aten::_scaled_dot_product_flash_attention_for_cpu",
              "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}
CPU_SDPA = "aten::_scaled_dot_product_flash_attention_for_cpu"
OP_MEANING = {"aten::bernoulli_": "dropout masks", "aten::copy_": "copies and dtype casts",
              "aten::mul": "element-wise: dropout scaling, AdamW", "aten::add_": "element-wise: AdamW, residuals",
              "aten::sqrt": "AdamW", "aten::mul_": "AdamW", "aten::addcdiv_": "AdamW", "aten::lerp_": "AdamW",
              "aten::div_": "AdamW, dropout",
              "aten::sum": "bias gradients", "aten::native_layer_norm": "layer norm",
              "aten::native_layer_norm_backward": "layer norm", "aten::gelu": "GELU", "aten::gelu_backward": "GELU",
              "aten::_softmax": "softmax", "aten::_softmax_backward_data": "softmax",
              "aten::embedding_dense_backward": "embedding gradient", "aten::linalg_vector_norm": "gradient clipping"}


def mm_ceiling(dtype: torch.dtype, n: int, seconds: float = 1.5) -> float:
    """Median FLOP/s of an n x n x n matmul over about `seconds` of calls."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b)
    rates, spent = [], 0.0
    while spent < seconds or len(rates) < 5:
        start = time.perf_counter()
        torch.mm(a, b)
        took = time.perf_counter() - start
        rates.append(2 * n ** 3 / took)
        spent += took
    return statistics.median(rates)


def make_step(model, optimizer, batch, dtype: str):
    def step():
        with record_function("forward"), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = model(**batch).loss
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return step


def attention_flops(model, batch_size: int, seq_len: int) -> int:
    """Scores and weighted sum, forward + backward (x3), when the fused CPU SDPA kernel hides them from
    FlopCounterMode: 2 matmuls of 2*b*s*s*hidden FLOPs per layer."""
    cfg = model.config
    return 3 * 2 * 2 * batch_size * seq_len * seq_len * cfg.hidden_size * cfg.num_hidden_layers


def measure(args, dtype: str) -> dict:
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(1000, model.config.vocab_size, (args.batch_size, args.seq_len), generator=g),
             "attention_mask": torch.ones(args.batch_size, args.seq_len, dtype=torch.long),
             "labels": torch.randint(0, 2, (args.batch_size,), generator=g)}
    step = make_step(model, optimizer, batch, dtype)
    step()  # warm-up: optimizer state, allocator, kernels
    with FlopCounterMode(display=False) as counter:
        step()
    flops = counter.get_total_flops()
    with profile(activities=[ProfilerActivity.CPU]) as probe:  # one step: is the fused SDPA kernel in use?
        step()
    fused_sdpa = any(e.key == CPU_SDPA for e in probe.key_averages())
    if fused_sdpa:
        flops += attention_flops(model, args.batch_size, args.seq_len)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    ceiling = mm_ceiling(DTYPES[dtype], args.mm_size)
    out = {"dtype": dtype, "flops_per_step": flops, "step_s_median": step_s, "train_flops_per_s": flops / step_s,
           "mm_ceiling_flops_per_s": ceiling, "efficiency": flops / step_s / ceiling,
           "attention_flops_added": fused_sdpa}
    if dtype == "fp32" and args.profile_below and out["efficiency"] < args.profile_below:
        out["analysis_md"] = analyse(step, out, args)
    return out


def analyse(step, measured: dict, args) -> str:
    """Where an fp32 step's time goes, from torch.profiler: written for RESULTS.md."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.profile_steps):
            step()
    events = prof.key_averages()
    n = args.profile_steps
    total = sum(e.self_cpu_time_total for e in events) / 1e6 / n
    phases = {e.key: e.cpu_time_total / 1e6 / n for e in events if e.key in ("forward", "backward", "optimizer")}
    ops = sorted((e for e in events if e.key not in phases), key=lambda e: e.self_cpu_time_total, reverse=True)
    mm_s = sum(e.self_cpu_time_total for e in ops if e.key in MATMUL_OPS) / 1e6 / n
    mm_flops = measured["flops_per_step"]  # FlopCounterMode counts only matmul-type ops (and attention, added above)
    lines = [f"fp32 training reaches {measured['efficiency']:.0%} of the fp32 matmul ceiling "
             f"({measured['train_flops_per_s'] / 1e9:.0f} of {measured['mm_ceiling_flops_per_s'] / 1e9:.0f} GFLOP/s; "
             f"batch {args.batch_size} x {args.seq_len} tokens). Profile of {n} steps (self CPU time per step, "
             f"{total:.3f} s in ops):", "",
             "| phase | s/step | share |", "|---|---|---|"]
    lines += [f"| {k} | {v:.3f} | {v / total:.0%} |" for k, v in phases.items()]
    lines += ["", "| op | self s/step | share | calls/step |", "|---|---|---|---|"]
    lines += [f"| `{e.key}` | {e.self_cpu_time_total / 1e6 / n:.4f} | {e.self_cpu_time_total / 1e6 / n / total:.1%} "
              f"| {e.count // n} |" for e in ops[:args.top_ops]]
    rest = total - mm_s
    others = [e for e in ops if e.key not in MATMUL_OPS][:5]
    named = ", ".join(f"`{e.key}` {e.self_cpu_time_total / 1e6 / n / total:.0%}"
                      + (f" ({what})" if (what := OP_MEANING.get(e.key)) else "") for e in others)
    lines += ["", f"Matrix multiplies (mm/addmm/bmm/fused attention) take {mm_s:.3f} s/step ({mm_s / total:.0%}) and "
              f"run at {mm_flops / mm_s / 1e9:.0f} GFLOP/s while they run "
              f"({mm_flops / mm_s / measured['mm_ceiling_flops_per_s']:.0%} of the large square matmul's rate). "
              f"The other {rest:.3f} s/step ({rest / total:.0%}) is in ops with no counted FLOPs, largest first: "
              f"{named}. The optimizer phase (clipping, AdamW, zero_grad) is "
              f"{phases.get('optimizer', 0) / total:.0%} of the step."]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--mm-size", type=int, default=2048)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--profile-below", type=float, default=0.5)
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--top-ops", type=int, default=12)
    p.add_argument("--out", help="JSON file for the result (default: stdout's last line)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = [measure(args, d) for d in args.dtypes.split(",")]
    result = {"threads": torch.get_num_threads(), "results": results}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    else:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
