"""Each ATen op of a real CPU step inside the model, timed, against what the roofline predicts for it.

    python benchmarks/cpu_ops_in_model.py                          # MiniLM, 1 x 30 tokens (the ladder's micro-batch)
    python benchmarks/cpu_ops_in_model.py --batch 32 --tokens 64   # make sweep's shape
    python benchmarks/cpu_ops_in_model.py --checkpointing full --top 40
    python benchmarks/cpu_ops_in_model.py --swept                  # each product and math op also timed swept

The job's model (model=..., fp32, one thread, freed host memory kept as jobs keep it) stepped forward and backward
in eager PyTorch, the gradients kept so that later micro-batches add into them as accumulation does. A dispatch
mode times each op's call (the kernel, its output's allocation, and the Python call of the op from the mode:
about 8-10 us an op here, which the prediction of an op timed at its bytes has no part of) and prices the same op
as the estimate does at this process's rates: a product or a math op (estimate/products.TIMED) as
measure/peak.product_s times it at its shape, any other op by the roofline (estimate/roofline.op_time). Printed per
op name, largest excess first, and per product shape. Where an op's kernel takes far longer in the model than its
prediction, the step time misses a mechanism: this is how cold product outputs, softmax's and GELU's per-element
math and checkpointing's hooks were found (README, "Step time"). The host's per-op cost beyond the kernel
(peak.seconds_per_op) is not in either column. `--swept` adds, per product and math op shape, its call timed after
twice the last-level cache is written (the sweep not timed): its operands, its output, and its kernel's code and
tables all out of the caches, which a call in a step whose layers stream more than the caches hold comes near.
"""
import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's memsweep
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's composer of a job's config


def timed_ops(model, batch, steps: int, rates, swept: bool = False) -> tuple[dict, dict, dict]:
    """{op name: [calls, measured s, predicted s]} and {(op, operand shapes): the same} over `steps` micro-batches,
    and (`swept`) {(op, operand shapes): its median call, each after a cache sweep (peak.cache_sweep)}, timed in
    the warm-up steps so that no sweep runs among the timed calls."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from memsweep.estimate import op_record, products, roofline
    from memsweep.measure import peak

    by_name, by_shape = defaultdict(lambda: [0, 0.0, 0.0]), defaultdict(lambda: [0, 0.0, 0.0])
    cold, sweep = {}, peak.cache_sweep() if swept else None

    class Timed(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not peak.launches(func):
                return func(*args, **kwargs)
            start = time.perf_counter()
            out = func(*args, **kwargs)
            took = time.perf_counter() - start
            operands = products.operands(args, kwargs) if func._overloadpacket in products.TIMED else None
            dtype, flops, moved = op_record.priced(func, args, kwargs, out, on_cpu=True)
            predicted = peak.product_s(str(func), operands) if operands is not None else roofline.op_time(
                dtype, flops, moved, rates)
            shape = (str(func), tuple(o.value.shape for o in operands if isinstance(o.value, products.TensorSpec))) \
                if operands is not None else None
            if swept and shape is not None and shape not in cold:
                cold[shape] = peak.median_seconds(lambda: func(*args, **kwargs), 0.0, warm=0, least=7, most=7,
                                                  before=sweep)
            rows = [by_name[str(func)]] + ([by_shape[shape]] if shape is not None else [])
            for row in rows:
                row[0], row[1], row[2] = row[0] + 1, row[1] + took, row[2] + predicted
            return out

    def step():
        model(**batch).loss.backward()

    for _ in range(3):  # warm: the gradients made, every product's timing cached
        with Timed():
            step()
    by_name.clear(), by_shape.clear()
    with Timed():
        for _ in range(steps):
            step()
    return by_name, by_shape, cold


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=30)
    parser.add_argument("--steps", type=int, default=10, help="micro-batches timed")
    parser.add_argument("--checkpointing", default="none", choices=["none", "full", "selective"])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--swept", action="store_true", help="also time each product and math op after a cache sweep")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForSequenceClassification

    from conftest import job_of
    from memsweep.config.hardware import load_profile
    from memsweep.estimate import roofline
    from memsweep.estimate.meta import model_config
    from memsweep.measure.host_memory import keep_freed_memory
    from memsweep.techniques import checkpointing

    torch.set_num_threads(1)
    keep_freed_memory()
    job, _ = job_of([f"model={args.model}", "hardware=cpu", "precision=fp32"])
    config, _ = model_config(job)
    model = AutoModelForSequenceClassification.from_config(config).train()
    if args.checkpointing != "none":
        checkpointing.enable(model, selective=args.checkpointing == "selective")
    batch = {"input_ids": torch.randint(0, 1000, (args.batch, args.tokens)),
             "attention_mask": torch.ones(args.batch, args.tokens, dtype=torch.long),
             "labels": torch.zeros(args.batch, dtype=torch.long)}
    by_name, by_shape, cold = timed_ops(model, batch, args.steps, roofline.rates_of(load_profile("cpu"), "fp32"),
                                        args.swept)
    n = args.steps
    measured, predicted = (sum(r[i] for r in by_name.values()) / n for i in (1, 2))
    print(f"{args.model} {args.batch} x {args.tokens} tokens, checkpointing {args.checkpointing}: per micro-batch "
          f"{1e3 * measured:.2f} ms of kernels measured, {1e3 * predicted:.2f} predicted")
    print(f"{'op':<46}{'calls':>6}{'measured ms':>13}{'predicted ms':>14}{'excess ms':>11}")
    for name, (calls, m, p) in sorted(by_name.items(), key=lambda kv: kv[1][2] - kv[1][1])[:args.top]:
        print(f"{name:<46}{calls / n:>6.0f}{1e3 * m / n:>13.3f}{1e3 * p / n:>14.3f}{1e3 * (m - p) / n:>+11.3f}")
    print("products and math ops by shape (per call):")
    for (name, shapes), (calls, m, p) in sorted(by_shape.items(), key=lambda kv: -kv[1][1])[:args.top]:
        after = f"  swept {1e6 * cold[(name, shapes)]:9.1f} us" if (name, shapes) in cold else ""
        print(f"  {name:<28}{str(shapes):<44} measured {1e6 * m / calls:9.1f} us  predicted {1e6 * p / calls:9.1f} us"
              + after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
