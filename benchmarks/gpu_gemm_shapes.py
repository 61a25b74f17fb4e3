"""Matrix products at a fine-tuning step's shapes on a CUDA GPU, and how the step-time roofline times them.

    python benchmarks/gpu_gemm_shapes.py --out FILE.json    # on a GPU: measure (about 30 s)
    python benchmarks/gpu_gemm_shapes.py --fit FILE.json    # anywhere: the roofline against a measured file

Measured: torch.mm of (rows x k) by (k x n), rows 128-32,768 (tokens of a micro-batch), (k, n) the widths of
BERT-base, BERT-large, TinyLlama, Llama-2/3 and their vocabularies' heads, in bf16, TF32 and fp32 (TF32 and fp32 up
to 8,192 rows); each also as a weight's gradient (a^T @ g, its first operand transposed); ten products per
synchronisation, the median over repeats. Batched products of attention's shapes and copies of 0.25 MiB-1 GiB too.

The fit: each product timed by estimate/roofline.py at the h200 profile's rates, once as a GPU op is
(math, then traffic: Rates.traffic_hidden off) and once as the longer of the two; the signed error of each against
the measured time, for products of 2,048 rows or more (fewer rows take a few microseconds, which the
measurement cannot tell from the host's launch of the next product).
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's memsweep

WIDTHS = [(768, 768), (768, 3072), (3072, 768), (1024, 1024), (1024, 4096), (4096, 1024), (2048, 2048),
          (2048, 5632), (4096, 4096), (4096, 11008), (11008, 4096), (4096, 14336), (4096, 32000)]
ROWS = (128, 512, 2048, 8192, 32768)
ELEMENT = {"bf16": 2, "tf32": 4, "fp32": 4}


def rate(torch, fn, work: float, reps: int = 10, seconds: float = 0.04) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    rates, spent = [], 0.0
    while spent < seconds or len(rates) < 5:
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        took = time.perf_counter() - start
        rates.append(reps * work / took)
        spent += took
    return statistics.median(rates)


def measure() -> dict:
    import torch

    out = {"gpu": torch.cuda.get_device_name(0), "sm": torch.cuda.get_device_properties(0).multi_processor_count,
           "mm": [], "bmm": [], "copy": []}  # mm: [dtype key (":gradW": a^T @ g), rows, k, n, TFLOP/s]
    for key, dtype in [("bf16", torch.bfloat16), ("tf32", torch.float32), ("fp32", torch.float32)]:
        torch.backends.cuda.matmul.allow_tf32 = key == "tf32"
        for m in ROWS:
            for k, n in WIDTHS:
                if m > 8192 and key in ("fp32", "tf32"):
                    continue
                a, b = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)
                g = torch.randn(m, n, device="cuda", dtype=dtype)
                out["mm"].append([key, m, k, n, rate(torch, lambda a=a, b=b: torch.mm(a, b), 2 * m * k * n) / 1e12])
                out["mm"].append([key + ":gradW", m, k, n,
                                  rate(torch, lambda a=a, g=g: torch.mm(a.t(), g), 2 * m * k * n) / 1e12])
        for bh, t, d in [(96, 512, 64), (384, 512, 64), (384, 197, 64), (768, 197, 64), (256, 1024, 128),
                         (1024, 128, 64)]:
            q, kt = torch.randn(bh, t, d, device="cuda", dtype=dtype), torch.randn(bh, d, t, device="cuda", dtype=dtype)
            out["bmm"].append([key, bh, t, d,
                               rate(torch, lambda q=q, kt=kt: torch.bmm(q, kt), 2 * bh * t * t * d) / 1e12])
    torch.backends.cuda.matmul.allow_tf32 = False
    for mib in (0.25, 1, 4, 16, 64, 256, 1024):
        src = torch.empty(int(mib * 2**20), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        out["copy"].append([mib, rate(torch, lambda dst=dst, src=src: dst.copy_(src),
                                      2 * src.numel()) / 1e9])  # GB/s read + written
    return out


def fit(measured: dict, profile: str = "h200", min_rows: int = 2048) -> dict:
    """Signed errors (%) of the roofline's time for each measured product, as a GPU times it and as the longer
    of math and traffic: {"sum": [...], "max": [...]} per dtype key, and over all."""
    import dataclasses

    from memsweep.config.hardware import load_profile
    from memsweep.estimate import roofline

    errors: dict = {}
    for key, m, k, n, tflops in measured["mm"]:
        dtype = key.split(":")[0]
        if m < min_rows:
            continue
        rates = roofline.rates_of(load_profile(profile), dtype)
        flops, moved = 2 * m * k * n, ELEMENT[dtype] * (m * k + k * n + m * n)
        took = flops / (tflops * 1e12)
        for model, hidden in (("sum", False), ("max", True)):
            timed = roofline.op_time(dtype, flops, moved, dataclasses.replace(rates, traffic_hidden=hidden))
            for group in (key, "all"):
                errors.setdefault(group, {"sum": [], "max": []})[model].append(100 * (timed - took) / took)
    return errors


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--fit", type=Path)
    args = parser.parse_args(argv)
    if args.fit:
        for group, models in fit(json.loads(args.fit.read_text())).items():
            print(f"{group:11s} {len(models['sum']):4d} products  " + "  ".join(
                f"{m}: median {statistics.median(v):+6.1f} %, median |error| {statistics.median(map(abs, v)):5.1f} %"
                for m, v in models.items()))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu-gemm-shapes: no CUDA GPU on this machine, nothing was measured")
        return 0
    text = json.dumps(measure())
    if args.out:
        args.out.write_text(text + "\n")
    print(text[:400])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
