"""The published decoder rows (benchmarks/published/) as memsweep jobs, or the reason a row cannot be one.

A row is a job only where its source states (or its configs at the cited commit fix) everything that
sets the memory: model, micro-batch, tokens per sequence, precision, optimizer, checkpointing, LoRA
targets. A technique memsweep does not have (chunked cross-entropy, the optimizer step inside the
backward, torch.compile's fusion, torchtune's activation offloading, Float8 matmuls, 4-bit optimizer
states, NF4 double quantization), or a library version whose memory differs from the one memsweep
installs (bitsandbytes before 0.43.2), makes the row NotModelled, naming it. Each function returns
(overrides, caveat): the caveat says where the job is an approximation of the source's set-up.
"""
from collections.abc import Callable
from typing import Any

Job = tuple[list[str], str]


class NotModelled(Exception):
    """A published row memsweep cannot express as a job; the message says why."""


ATTENTION = "[q_proj,v_proj]"
ALL_LINEAR = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"


def _refuse(missing: list[str]) -> None:
    if missing:
        raise NotModelled("; ".join(missing))


# --- torchtune README ladder: Llama 3.2 3B, batch 2 x 4096, bf16, A100 ----------------------------

def torchtune_ladder(row: dict[str, Any], common: dict[str, Any]) -> Job:
    missing = []
    if not row["packed"]:
        missing.append("unpacked Alpaca batches are padded to each batch's longest sample, a data-dependent length "
                       "the table does not give (4096 is only the truncation)")
    if row["compile"]:
        missing.append("torch.compile: memsweep estimates compile=on as eager execution, without the fused kernels")
    if "Chunked" in str(row["loss"]):
        missing.append("chunked cross-entropy (CEWithChunkedOutputLoss upcasts the 128,256-wide logits one chunk at a "
                       "time); memsweep's loss takes the whole logits")
    if row["optimizer_in_backward"]:
        missing.append("optimizer step inside the backward (optimizer_in_bwd frees each gradient as its parameter "
                       "steps); memsweep steps after the whole backward")
    if row["activation_offloading"]:
        missing.append("torchtune's activation offloading (OffloadActivations, on a side stream); memsweep's "
                       "offload=activations is torch's save_on_cpu")
    if "8bit" in str(row["optimizer"]):
        missing.append("8-bit AdamW of an unstated implementation (torchao or bitsandbytes)")
    if row["finetuning"] == "qlora":
        missing.append("torchao NF4 base weights; memsweep's qlora is bitsandbytes NF4")
    _refuse(missing)  # what is left: a full fine-tune of packed rows without compile
    # A100 with 60 GiB in use: the 80 GB card. No clip_grad_norm in the configs; torch.optim.AdamW
    # with neither fused nor foreach set (foreach on CUDA).
    return (["task=causal_lm", "model=llama-3.2-3b", "hardware=a100_80gb", "batch_size=2", "max_seq_len=4096",
             "precision=bf16_true", "optim=adamw_torch", "optim.max_grad_norm=0",
             f"checkpointing={'full' if row['activation_checkpointing'] else 'none'}"],
            "packed: 4096-token sequences with one causal mask over the pack (torchtune masks per document)")


# --- torchao low-bit optimizers: Llama-2-7B full bf16 ---------------------------------------------

def torchao_llama2(row: dict[str, Any], common: dict[str, Any]) -> Job:
    missing = ["micro-batch, sequence length, activation checkpointing and optimizer-in-backward are not stated "
               "(only 'full BF16' on Alpaca with torchtune)"]
    if "4bit" in str(row["optimizer"]):
        missing.append("4-bit AdamW states: memsweep has no 4-bit optimizer")
    raise NotModelled("; ".join(missing))


# --- Lit-GPT LoRA on 1 x A100-40GB ----------------------------------------------------------------

# hub id -> (memsweep model option, the LoRA targets that are lit-gpt's q and v, overrides for lit-gpt's kernels)
SHIPPED = {
    "meta-llama/Llama-2-7b-hf": ("llama-2-7b", ATTENTION, []),
    "meta-llama/Llama-2-13b-hf": ("llama-2-13b", ATTENTION, []),
    # lit-gpt's phi-1_5 MLP is F.gelu(approximate="tanh") (its config's gelu_approximate="tanh"), which is
    # transformers' gelu_pytorch_tanh; the hub's gelu_new is the same function written as eager elementwise
    # ops, whose saved intermediates the trace would count
    "microsoft/phi-1_5": ("phi-1.5", ATTENTION, ["+model.overrides.hidden_act=gelu_pytorch_tanh"]),
    # GPT-NeoX has one fused query_key_value linear, as lit-gpt does; lit-gpt puts LoRA on its q and v
    # slices, memsweep (peft) on the whole linear: the same 131,072 LoRA weights a layer (A 8x4096 and
    # B 12288x8 against lit-gpt's A 16x4096 and B 8192x8), a differently shaped intermediate.
    "stabilityai/stablelm-base-alpha-3b": ("stablelm-base-alpha-3b", "[query_key_value]", []),
}
FUSED_QKV_CAVEAT = ("LoRA on the whole fused query_key_value (peft) for lit-gpt's LoRA on its q and v slices: the "
                    "same trainable count, a (tokens x 12,288) LoRA output for lit-gpt's (tokens x 8,192)")


def litgpt_lora(row: dict[str, Any], common: dict[str, Any]) -> Job:
    return litgpt_job(row, gpus=1)


def litgpt_job(row: dict[str, Any], gpus: int) -> Job:
    """lit-gpt's finetune/lora.py: 128 sequences a step on each of `gpus` ranks, micro-batch per rank."""
    hub_id = str(row["model"]).split()[0]
    if hub_id not in SHIPPED:
        raise NotModelled(f"no shipped architecture for {hub_id} (src/memsweep/archs/)")
    name, targets, kernels = SHIPPED[hub_id]
    quantization = str(row["quantization"]).split()[0]
    adapters = ["optim=adamw_torch", "lora=r8"]
    caveat = "transformers' model code for lit-gpt's (the same layers and shapes)"
    if quantization.startswith("bnb.nf4"):
        # Lightning's BitsandbytesPrecision (Lightning 71aed751, read) replaces every nn.Linear, the head
        # included, by a 4-bit one computing in bf16; lit-gpt then steps bitsandbytes' PagedAdamW (32-bit)
        adapters = ["optim=paged_adamw_32bit", "lora=qlora", "model.quantize_skip_modules=[]",
                    f"lora.double_quant={str(quantization == 'bnb.nf4-dq').lower()}"]
        caveat += ("; the paged AdamW state of the adapters counted as device memory (bitsandbytes pages it in "
                   "unified memory, outside the allocated counter)")
    if targets != ATTENTION:
        caveat += "; " + FUSED_QKV_CAVEAT
    if kernels:
        caveat += "; GELU as lit-gpt runs it, F.gelu(approximate='tanh') (hidden_act gelu_pytorch_tanh for gelu_new)"
    # bf16-true: Fabric creates every parameter, LoRA's too, in bf16 (peft would keep the adapters in fp32)
    return (["task=causal_lm", f"model={name}", "hardware=a100_40gb", f"batch_size={128 * gpus}",
             f"accumulation.steps={128 // int(row['micro_batch'])}", f"max_seq_len={row['seq_len']}",
             "precision=bf16_true", *adapters, "lora.autocast_adapter_dtype=false", "lora.dropout=0.05",
             f"lora.target_modules={targets}", *kernels], caveat)


# --- torchtune tutorials: Llama-2-7B LoRA / QLoRA, batch 2, 512 tokens ------------------------------

# q and v, or every linear of the blocks and the output head
TORCHTUNE_TARGETS = {"q_proj, v_proj": ATTENTION,
                     "q_proj, k_proj, v_proj, output_proj, MLP": ALL_LINEAR[:-1] + ",lm_head]"}


def _torchtune_llama2(rank: int, alpha: int, targets: str) -> Job:
    # dtype bf16: torchtune builds the model, LoRA's weights too, in bf16 (peft would keep the adapters in fp32)
    return (["task=causal_lm", "model=llama-2-7b", "hardware=a100_80gb", "batch_size=128", "accumulation.steps=64",
             "max_seq_len=512", "precision=bf16_true", "optim=adamw_torch", "optim.max_grad_norm=0",
             "checkpointing=full", "lora=r8", f"lora.r={rank}", f"lora.alpha={alpha}",
             "lora.autocast_adapter_dtype=false", "lora.dropout=0.05", f"lora.target_modules={targets}"],
            "GPU not stated: reserved is the same on every CUDA profile; 512 tokens, the truncation a 100-step "
            "window's longest batch reaches")


def torchtune_lora_ranks(row: dict[str, Any], common: dict[str, Any]) -> Job:
    targets = next(t for listed, t in TORCHTUNE_TARGETS.items() if row["lora_targets"].startswith(listed))
    return _torchtune_llama2(row["lora_rank"], row["lora_alpha"], targets)


def torchtune_qlora_vs_lora(row: dict[str, Any], common: dict[str, Any]) -> Job:
    if row["finetuning"] == "lora":
        return _torchtune_llama2(8, 16, ATTENTION)
    # The row's own model-init column says what its reserved figure is made of: 9.13 GB reserved after
    # loading alone, for about 4 GB of NF4 weights and bf16 embedding and head. Reserved never shrinks
    # without empty_cache, so the training window's peak starts from what loading left cached; memsweep
    # replays the training step from the loaded weights, not how a library loaded them.
    raise NotModelled(
        f"reserved here includes what torchtune's loading left cached: {row['model_init_reserved_published']} "
        "reserved at model init (the source's own column) for about 4 GB of NF4 weights and bf16 embedding and "
        "head; memsweep's allocator model replays the training step from the loaded weights, not the load; "
        "also torchao NF4 (double-quantized scales) where memsweep's qlora is bitsandbytes NF4")


# --- several GPUs -----------------------------------------------------------------------------------

def torchtitan(row: dict[str, Any], common: dict[str, Any]) -> Job:
    missing = []
    if row["compile"]:
        missing.append("torch.compile (memsweep estimates compile=on as eager execution, without the fused kernels)")
    if row["float8"]:
        missing.append("Float8 matmuls (torchao Float8Linear): memsweep has no float8 training")
    if missing:
        raise NotModelled("; ".join(missing))
    gpus = int(common["num_gpus"])
    nodes, per_node = (gpus // 8, 8) if gpus > 8 else (1, gpus)  # 8 GPUs per host
    # FSDP2 full_shard in bf16 mixed precision (fp32 sharded master weights, gradients and AdamW state), 2 x
    # 8192 tokens per GPU, torchtitan's op-level selective checkpointing (memsweep's `selective` policy)
    return (["task=causal_lm", "model=llama-3.1-8b", "hardware=h100", f"batch_size={2 * gpus}", "max_seq_len=8192",
             "precision=bf16", "optim=adamw_torch", "checkpointing=selective", "attention=sdpa", "fsdp=full_shard",
             f"distributed.nodes={nodes}", f"distributed.nproc={per_node}"],
            "rank 0 of the job's ranks; an H100 with 96 GB where memsweep's h100 is the 80 GB card (reserved is the "
            "same); memsweep wraps FSDP as Accelerate does: each decoder layer and the root, as torchtitan does")


def litgpt_fsdp(row: dict[str, Any], common: dict[str, Any]) -> Job:
    # Each per-rank figure is above a whole unsharded bf16 model plus the rank's shard (Llama-2-7B on 2 GPUs:
    # 20.66 GiB against 12.55 + 6.28): FSDP1's flat parameters give every block its whole gradient, kept
    # unsharded over the 128 / micro-batch accumulated micro-batches (older_libraries.FSDP1_FLAT, named by
    # the table's FSDPStrategy). Lit-gpt's strategy: each Block a unit and checkpointed, FULL_SHARD.
    n = int(str(row["gpus"]).split()[0])
    job, caveat = litgpt_job(row, gpus=n)
    return job + [f"distributed.nproc={n}", "fsdp=full_shard", "checkpointing=full"], caveat + (
        "; rank 0's training step, where the source prints rank 0's whole-run peak (training, and the validation "
        "and generation every 100 steps)")


TABLES: dict[str, Callable[[dict[str, Any], dict[str, Any]], Job]] = {
    "torchtune_llama32_3b_optimization_ladder": torchtune_ladder,
    "torchao_low_bit_adamw_llama2_7b": torchao_llama2,
    "litgpt_lora_alpaca_1xa100_40gb": litgpt_lora,
    "torchtune_llama2_7b_lora_rank_targets": torchtune_lora_ranks,
    "torchtune_llama2_7b_qlora_vs_lora_reserved": torchtune_qlora_vs_lora,
    "torchtitan_llama31_8b_fsdp_8xh100": torchtitan,
    "torchtitan_llama31_8b_fsdp_128xh100": torchtitan,
    "litgpt_lora_alpaca_multi_a100_fsdp": litgpt_fsdp,
}
