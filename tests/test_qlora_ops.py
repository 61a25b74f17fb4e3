"""bitsandbytes' 4-bit path op by op: one Linear4bit with peft's LoRA beside it, run for real on the CPU (every
allocation by torch's profiler) and traced as the estimate traces it (benchmarks/qlora_ops.py). Left out of the
real sums, each for a stated reason: the scratch a CPU matmul makes and frees inside itself (a GPU's cuBLAS
workspace is counted apart) and Python numbers wrapped as 0-dim CPU tensors (host memory on a GPU job too)."""
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import qlora_ops  # noqa: E402

# few tokens: the layer's dequantized weight outweighs its activations, so the forward's peak is inside gemm_4bit
TOKENS = 16


@pytest.mark.parametrize("double_quant", [False, True], ids=["nf4", "nf4-dq"])
def test_the_trace_keeps_and_peaks_as_the_real_4bit_lora_layer_to_the_byte(double_quant):
    real, traced = qlora_ops.real(double_quant, TOKENS), qlora_ops.traced(double_quant, TOKENS)
    assert traced.peak_bytes == real.peak_bytes
    # inside gemm_4bit the CPU dequantizes the whole weight (and, double-quantized, its block scales)
    assert traced.forward_peak_bytes == real.forward_peak_bytes
    assert traced.kept_bytes == real.kept_bytes > 0  # LoRA's dropout mask and output, lora_A's output
    assert traced.saved_bytes == real.saved_bytes == traced.kept_bytes  # MatMul4Bit keeps only its packed weight
    dequantized = {(b.phase, b.op, b.nbytes) for b in real.blocks if "dequantize" in b.op}
    weight_bytes = qlora_ops.IN_FEATURES * qlora_ops.OUT_FEATURES * 2  # bf16, the compute dtype
    assert ("forward", "dequantize_4bit", weight_bytes) in dequantized
    assert ("backward", "dequantize_4bit", weight_bytes) in dequantized
    assert dequantized <= {(b.phase, b.op, b.nbytes) for b in traced.blocks}


def test_the_4bit_matmul_is_traced_as_the_steps_it_allocates():
    """Without the dequantize-then-linear steps (gemm_4bit's fake kernel makes only its output) the trace's forward
    peak lacks the dequantized weight: the check above could fail."""
    import contextlib

    from memsweep.estimate import fake

    real = qlora_ops.real(False, TOKENS)
    installed = fake.gemm_4bit_dequantized
    fake.gemm_4bit_dequantized = contextlib.nullcontext
    try:
        fused = qlora_ops.traced(False, TOKENS)
    finally:
        fake.gemm_4bit_dequantized = installed
    assert not any(b.phase == "forward" and "dequantize" in b.op for b in fused.blocks)
    assert fused.forward_peak_bytes < real.forward_peak_bytes

