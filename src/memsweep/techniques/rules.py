"""The combinations that cannot run, one row each, checked before any work is done.

A refused job is a result (`status: unsupported` with the row's reason), not a crash, and the sweep
goes on. `python -m memsweep.techniques.rules` prints the table.
"""
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from ..config.schema import Config, HardwareConf
from ..errors import Unsupported
from . import Techniques, deepspeed, traits_of


@dataclass(frozen=True)
class Rule:
    name: str
    refuses: Callable[[Techniques, HardwareConf], bool]  # asks the groups' traits, never their raw keys
    reason: str


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _ds_op_available(op: str) -> bool:
    """A DeepSpeed op the job can load: built into the installed DeepSpeed (DS_BUILD_<OP>=1), or built by
    DeepSpeed on first use (run/ds_ops.py), which needs ninja and a C++ compiler."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None:
        return False
    if deepspeed.can_build_ops():
        return True
    from pathlib import Path

    root = Path(spec.submodule_search_locations[0]) / "ops"
    return any(root.rglob(f"{op}*.so"))


def _quantized(t: Techniques) -> bool:
    return t.lora.quantize is not None


RULES: list[Rule] = [
    Rule("bf16-unsupported", lambda t, hw: t.precision.needs == "bf16" and not hw.bf16,
         "bf16 needs an Ampere-or-newer GPU (or a CPU); this profile has none — use precision=fp16"),
    Rule("tf32-unsupported", lambda t, hw: t.precision.needs == "tf32" and not hw.tf32,
         "TF32 is a tensor-core mode of Ampere-or-newer GPUs; this device has no TF32 matmuls"),
    Rule("no-gpu", lambda t, hw: hw.device == "cuda" and not _cuda(),
         "this hardware profile is a CUDA GPU and none is visible here; predict it without a GPU with "
         "mode=estimate, or run hardware=cpu"),
    Rule("flash-attention", lambda t, hw: t.attention.implementation == "flash_attention_2"
         and (hw.device != "cuda" or not _installed("flash_attn")),
         "flash_attention_2 needs a CUDA GPU and the flash-attn package; use attention=sdpa"),
    Rule("bitsandbytes-missing",
         lambda t, hw: (_quantized(t) or t.optim.bitsandbytes) and not _installed("bitsandbytes"),
         "8-bit/4-bit weights and optimizers need the bitsandbytes package"),
    Rule("torchao-missing", lambda t, hw: t.optim.torchao and not _installed("torchao"),
         "adamw_torch_8bit and adamw_torch_4bit are torchao's low-bit AdamW: they need the torchao package"),
    Rule("quantized-with-deepspeed", lambda t, hw: _quantized(t) and t.deepspeed.on,
         "DeepSpeed partitions and casts the weights itself; bitsandbytes-quantized base weights "
         "cannot be handed to it — use lora=r8 with DeepSpeed, or deepspeed=none with qlora/int8"),
    Rule("8bit-optim-with-zero", lambda t, hw: t.optim.bitsandbytes and (t.deepspeed.stage or 0) >= 1,
         "ZeRO partitions the optimizer state itself; bitsandbytes' 8-bit state cannot be partitioned"),
    Rule("offload-needs-adam", lambda t, hw: (t.deepspeed.offload_optimizer or t.deepspeed.offload_param)
         and (t.optim.rule != "adamw" or t.optim.kernels != "torch"),
         "ZeRO offload steps the optimizer on the CPU with DeepSpeed's CPUAdam: use optim=adamw"),
    Rule("offload-needs-cpu-adam-op", lambda t, hw: t.deepspeed.offload_optimizer and not _ds_op_available("cpu_adam"),
         "ZeRO offload needs DeepSpeed's cpu_adam op, which is not built and cannot be built here: DeepSpeed builds "
         "it on first use with ninja and a C++ compiler (pip install ninja; a c++ on PATH or $CXX)"),
    Rule("deepspeed-cpu-fp16", lambda t, hw: t.deepspeed.on and hw.device == "cpu" and t.precision.loss_scaling,
         "on the CPU memsweep does fp16 with autocast + GradScaler, which cannot drive DeepSpeed's "
         "engine (it does its own loss scaling); use precision=bf16 or fp32 with DeepSpeed here"),
    Rule("fp64-with-bitsandbytes", lambda t, hw: t.precision.compute == "fp64" and (
        t.lora.quantize == "nf4" or (t.optim.bitsandbytes and hw.device == "cuda")),
         "bitsandbytes' 4-bit quantization and its CUDA optimizer kernels take fp32, fp16 or bf16 tensors, not fp64 "
         "(\"Unsupported gradient dtype\"): use precision=fp32 with them"),
    Rule("deepspeed-bf16-true", lambda t, hw: t.deepspeed.on and t.precision.param_bytes == 2,
         "DeepSpeed keeps its own fp32 master weights; use precision=bf16 or fp16 (mixed) with DeepSpeed"),
    Rule("activation-offload-on-cpu", lambda t, hw: t.offload.activations and hw.device == "cpu",
         "activations already live in host memory on the CPU: offloading them there only adds a copy; "
         "offload=activations is for GPUs"),
    Rule("optimizer-offload-on-one-process", lambda t, hw: t.offload.optimizer and (
        t.processes > 1 or t.deepspeed.on or t.fsdp.on),
         "torchao's CPUOffloadOptimizer is for one GPU: its hook copies each gradient to the host before "
         "several processes would reduce it; with several GPUs use deepspeed=zero2_offload or "
         "fsdp=full_shard_offload"),
    Rule("gradient-offload-with-accumulation", lambda t, hw: t.offload.grads and t.accumulation_steps > 1,
         "offload=optimizer_and_grads copies each micro-batch's gradient over the last one on the host (torchao: "
         "\"not compatible with gradient accumulation\"): use offload=optimizer, or accumulation=none"),
    Rule("optimizer-offload-with-loss-scaling", lambda t, hw: t.offload.optimizer and t.precision.loss_scaling,
         "the host optimizer steps the gradients copied as backward makes them, still multiplied by "
         "GradScaler's scale (it unscales only the GPU's): use precision=bf16, bf16_true or fp32"),
    Rule("optimizer-offload-needs-a-gpu", lambda t, hw: t.offload.optimizer and hw.device != "cuda",
         "torchao's CPUOffloadOptimizer moves the optimizer from a CUDA GPU to the host (it asserts CUDA or XPU); "
         "on the CPU the optimizer already lives in host memory"),
    Rule("deepspeed-with-fsdp", lambda t, hw: t.deepspeed.on and t.fsdp.on,
         "DeepSpeed and FSDP both shard the model: choose one"),
    Rule("fsdp-offload-on-cpu", lambda t, hw: t.fsdp.offload and hw.device == "cpu",
         "FSDP2's CPU offload (CPUOffloadPolicy, as Accelerate builds it) pins host memory, which needs an "
         "accelerator (\"Cannot access accelerator device when none is available\"); on the CPU the parameters "
         "already live in host memory: fsdp=full_shard_offload is for GPUs, use fsdp=full_shard here"),
    Rule("8bit-optim-with-fsdp", lambda t, hw: t.optim.bitsandbytes and t.fsdp.on,
         "FSDP2 shards parameters as DTensors and bitsandbytes' optimizer kernels have no DTensor sharding rule "
         "(\"bitsandbytes.optimizer_update_32bit does not have a sharding strategy registered\"): use optim=adamw"),
    Rule("int8-with-fsdp", lambda t, hw: t.lora.quantize == "int8" and t.fsdp.on,
         "FSDP2 shards every parameter as a DTensor, which drops the quantization state of bitsandbytes' LLM.int8 "
         "weights (the first forward fails: \"'Parameter' object has no attribute 'CB'\"); Accelerate exempts only "
         "4-bit weights from sharding: use lora=qlora or lora=r8 with FSDP"),
    Rule("qlora-with-fsdp1", lambda t, hw: t.lora.quantize == "nf4" and t.fsdp.flat,
         "FSDP1 flattens each unit's parameters into one floating-point tensor (torch fsdp/_flat_param.py: \"Cannot "
         "flatten integer dtype tensors\"), and bitsandbytes' packed 4-bit weights are uint8: use fsdp.version=2"),
    Rule("adafactor-with-fsdp", lambda t, hw: t.optim.rule == "adafactor" and t.fsdp.on,
         "transformers' Adafactor keeps plain-tensor state next to FSDP2's DTensor parameters "
         "(\"got mixed torch.Tensor and DTensor\"): use optim=adamw or sgd with FSDP"),
]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def refuse_unsupported(cfg: Config, hw: HardwareConf, skip: tuple[str, ...] = ()) -> None:
    """Raise Unsupported with the first matching rule's reason; rules named in `skip` are not asked
    (an estimate skips `no-gpu`: it predicts a GPU without one)."""
    techniques = traits_of(cfg)
    for rule in RULES:
        if rule.name not in skip and rule.refuses(techniques, hw):
            raise Unsupported(f"{rule.name}: {rule.reason}")


if __name__ == "__main__":
    for rule in RULES:
        print(f"{rule.name:28s} {rule.reason}")
