"""The rates a CUDA GPU and its host reach, measured on them: what the step-time roofline's datasheet rates leave out.

- matmul: median FLOP/s of an n x n x n product per compute dtype (fp32 with TF32 off, TF32, fp16, bf16), at a
  large n (the card's ceiling) and at the widths of a fine-tuning step's matmuls;
- memory: a device-to-device copy, bytes read and written over its time;
- the host's dispatch of one eager op: a chain of small ops on a one-element tensor (the GPU's work per op is a
  launch, so the host's time per op paces it), timed on the host clock with one synchronisation at the end,
  once as bare ATen calls and once as a small module's forward and backward through autograd.

Writes one JSON object to --out (or prints it). Without a GPU it says so and exits 0.
"""
import argparse
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's memsweep

from memsweep.measure.peak import median_rate, median_seconds, ops_in  # noqa: E402


def matmul_tflops(torch, dtype, n: int, m: int | None = None, k: int | None = None) -> float:
    m, k = m or n, k or n
    a, b = torch.randn(n, k, device="cuda", dtype=dtype), torch.randn(k, m, device="cuda", dtype=dtype)
    # ten products per synchronisation: a small one's launch and the round trip are not its time
    return median_rate(lambda: [torch.mm(a, b) for _ in range(10)], 10 * 2 * n * m * k, 0.5,
                       torch.cuda.synchronize) / 1e12


def copy_gbs(torch, nbytes: int = 2**31) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return median_rate(lambda: dst.copy_(src), 2 * nbytes, 0.5, torch.cuda.synchronize) / 1e9  # read and written


def dispatch_us(torch, ops: int = 5000) -> dict:
    """Host microseconds per op: bare ATen adds, and a tiny MLP's forward + backward (ops counted by the
    profiler-free way: aten ops seen by a dispatch mode over one pass)."""
    x = torch.zeros(1, device="cuda")
    bare = median_seconds(lambda: [x.add_(1.0) for _ in range(ops)], 0.5, torch.cuda.synchronize) / ops

    mlp = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(8)]).cuda()
    data = torch.randn(4, 8, device="cuda")

    def step():
        mlp(data).sum().backward()

    ops = ops_in(step, counted=lambda func: True)  # every ATen op, as recorded in gpu_snapshots/h200_rates.json
    per_step = median_seconds(lambda: [step() for _ in range(50)], 0.5, torch.cuda.synchronize) / 50
    return {"aten_add_us": 1e6 * bare, "module_fwd_bwd_us_per_op": 1e6 * per_step / ops, "module_ops_per_step": ops}


def measure() -> dict:
    import torch

    dtypes = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "host_cpu": _cpu_name(), "python": platform.python_version(), "matmul_tflops": {}}
    for key, dtype in dtypes.items():
        torch.backends.cuda.matmul.allow_tf32 = key == "tf32"
        # the ceiling, and a step's shapes: 4,096 tokens x 1,024 wide into 4,096 (a feed-forward layer's)
        out["matmul_tflops"][key] = {"8192^3": matmul_tflops(torch, dtype, 8192),
                                     "4096x1024x4096": matmul_tflops(torch, dtype, 4096, 4096, 1024),
                                     "4096x768x768": matmul_tflops(torch, dtype, 4096, 768, 768)}
    torch.backends.cuda.matmul.allow_tf32 = False
    out["copy_gbs"] = copy_gbs(torch)
    out["dispatch"] = dispatch_us(torch)
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu-rates: no CUDA GPU on this machine, nothing was measured")
        return 0
    text = json.dumps(measure(), indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
