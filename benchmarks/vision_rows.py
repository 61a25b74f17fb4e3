"""The published vision-transformer rows (benchmarks/published/) as memsweep jobs, or the reason a row
cannot be one.

The sources trained torchvision's and timm's ViTs; memsweep builds transformers' `ViTForImageClassification`.
For the sizes here they are the same network: pre-LN blocks of the same width, heads and MLP width, a class
token and learned positions over the same patch grid, no dropout. torchvision's `vit_l_16` makes queries,
keys and values in one matmul (`nn.MultiheadAttention`'s `in_proj`) where transformers makes three: the same
bytes held for backward. transformers' classifier has no pooler (as torchvision's and timm's heads). The
differences that remain are named in each row's caveat.
"""
from collections.abc import Callable
from typing import Any

from decoder_rows import NotModelled

Job = tuple[list[str], str]

VIT = ["task=image_classification"]  # the digits' 10 classes: CIFAR-10's count
PRECISION = {"fp32": "fp32", "fp16_mixed": "fp16", "bf16_true": "bf16_true", "bf16_mixed": "bf16"}
TORCHVISION_L16 = ("torchvision vit_l_16 as transformers' ViT-L/16 (model=vit-l16): 24 blocks of 1024, 16 heads, "
                   "MLP 4096, 197 tokens, 303.3M parameters with the 10-class head; the GPU is not stated: an "
                   "A100-40GB profile (the reserved bytes do not depend on its size below the peak)")


def rasbt_vit_l16(row: dict[str, Any], common: dict[str, Any]) -> Job:
    """Raschka's ladder: fp32 -> fp16 AMP -> pure bf16 -> smaller batch -> accumulation -> SGD -> FSDP."""
    precision = PRECISION[str(row["precision"]).split()[0]]  # TF32 matmuls (rows 02 on) hold fp32's bytes
    optim = "sgd" if str(row["optimizer"]).startswith("sgd") else "adamw_torch"  # torch.optim.Adam: AdamW's state
    n, mb, acc = int(row["num_gpus"]), int(row["micro_batch"]), int(row["gradient_accumulation"])
    job = VIT + ["model=vit-l16", "hardware=a100_40gb", f"batch_size={mb * acc * n}", f"accumulation.steps={acc}",
                 f"precision={precision}", f"optim={optim}"]
    if n > 1:  # Fabric's FSDP1 (FULL_SHARD, each EncoderBlock a unit and checkpointed): memsweep's FSDP2
        offload = "cpu_offload" in str(row.get("distributed", ""))
        job += [f"distributed.nproc={n}", "checkpointing=full",
                f"fsdp={'full_shard_offload' if offload else 'full_shard'}"]
        return job, TORCHVISION_L16 + "; rank 0's training step, where the source prints the whole run's peak"
    return job, TORCHVISION_L16


def torchao_vit_h(row: dict[str, Any], common: dict[str, Any]) -> Job:
    """torchao's low-bit AdamW table: ViT-H/14, batch 8, bf16 autocast, one optimizer per row."""
    optimizer, caveat = str(row["optimizer"]), ""
    if optimizer.startswith("adamw (torch.optim.AdamW, fused=True)"):
        optim = "adamw_fused"
    elif "bitsandbytes" in optimizer:
        optim = "adamw_8bit"
    elif optimizer.startswith("adamw_8bit (torchao AdamW8bit"):
        optim = "adamw_torch_8bit"
    elif optimizer.startswith("adamw_4bit (torchao AdamW4bit"):
        # Trainer gives torchao's 4-bit AdamW blocks of 256 values; the source kept torchao's own 128
        optim, caveat = "adamw_torch_4bit", ("; Trainer's 4-bit blocks of 256 for the source's 128 (one fp32 "
                                             "scale per block: about 20 MB fewer)")
    else:
        raise NotModelled(f"{optimizer}: memsweep's optimizers are transformers' (torchao's FP8 AdamW and lpmm's "
                          "4-bit AdamW are not among them)")
    job = VIT + ["model=vit-h14", "hardware=rtx4090", "batch_size=8", "precision=bf16", f"optim={optim}"]
    return job, ("timm vit_huge_patch14_224 as transformers' ViT-H/14 (model=vit-h14: 32 blocks of 1280, 257 tokens); "
                 "a 10-class head for the 45-class one (35 x 1281 parameters fewer); traced eager (the source "
                 "compiled the model; torchao's optimizer step, compiled in the source, too); an RTX 4090 profile "
                 "for the 16 GB RTX 4070 Ti SUPER (allocated bytes do not depend on the card)" + caveat)


def torchao_vit_giant(row: dict[str, Any], common: dict[str, Any]) -> Job:
    """torchao's CPU-offload tables: DINOv2 ViT-g/14 at batch 32, 224 x 224, every block checkpointed, fused AdamW."""
    offload, precision, engine, caveat = str(row.get("offload")), PRECISION[str(row["precision"]).split()[0]], [], ""
    if offload.startswith("DeepSpeed"):
        # the script's DeepSpeed config: ZeRO-2, overlap_comm, the optimizer offloaded to pinned CPU memory, bf16
        # on, DeepSpeed's default 5e8-value reduce bucket. DeepSpeed casts the model to bf16 itself, so its
        # bf16 from the fp32 weights (memsweep's precision=bf16) is the script's model.bfloat16() + bf16
        offload, precision = "none", "bf16"
        engine = ["deepspeed=zero2_offload", "deepspeed.overlap_comm=true", "deepspeed.reduce_bucket_size=500000000"]
        caveat = "; DeepSpeed ZeRO-2 with optimizer offload, casting the model to bf16 as the script's bf16 model"
    elif offload.startswith("torchao CPUOffloadOptimizer"):  # the script's --optim_cpu_offload ao / ao_offload_grads
        offload = "optimizer_and_grads" if "offload_gradients=True" in offload else "optimizer"
    # timm resamples the 518-px model's positions to 224 px: a position table of another shape than the weights',
    # which memsweep refuses unless asked (model.new_parts_random); its bytes are the same either way
    job = VIT + ["model=dinov2-giant", "+model.overrides.image_size=224", "model.new_parts_random=true",
                 "hardware=rtx4090", "hardware.memory_gib=16",
                 "batch_size=32", f"precision={precision}", "optim=adamw_fused", "checkpointing=full",
                 f"offload={offload}", *engine]
    return job, ("timm vit_giant_patch14_dinov2 as transformers' Dinov2 (model=dinov2-giant: the same blocks, "
                 "SwiGLU MLP of 4096 and layer scale; timm packs gate and up in one matmul, transformers makes two, "
                 "the same bytes); 224 x 224 crops, the script's, so 257 tokens (timm builds the 518-px model at 224 "
                 "with `img_size=224`, its positions resampled); transformers' head reads the class token and the mean "
                 "patch token (3,072 inputs) for a 10-class one where timm's reads the class token for 45 classes; "
                 "the RTX 4090 profile with the RTX 4070 Ti SUPER's 16 GiB"
                 + ("; traced eager (the source compiled the model)" if row.get("compile") else "") + caveat)


TABLES: dict[str, Callable[[dict[str, Any], dict[str, Any]], Job]] = {
    "rasbt_vit_l16_cifar10_memory_ladder": rasbt_vit_l16,
    "torchao_low_bit_adamw_vit_h": torchao_vit_h,
    "torchao_cpu_offload_vit_giant": torchao_vit_giant,
    "torchao_cpu_offload_vit_giant_ablation": torchao_vit_giant,
}
