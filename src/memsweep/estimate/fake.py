"""The trace's world: the job's meta model on fake tensors (torch's FakeTensorMode: shapes and dtypes, no
storage), autocast as Accelerate applies it, and where a GPU runs other code than the CPU the GPU's,
on CPU fake tensors: its dropout and attention kernels, its autocast's float32 ops, bitsandbytes' LLM.int8
matmul, and the host copies of activation offload; bitsandbytes' 4-bit matmul as the steps it allocates.
"""
import contextlib
import logging

import torch

from ..config.schema import HardwareConf


def accelerate_dtype(setup) -> torch.dtype | None:
    """The autocast dtype Accelerate applies for the bf16/fp16 TrainingArguments (wrapping model.forward)."""
    return torch.bfloat16 if setup.args.get("bf16") else torch.float16 if setup.args.get("fp16") else None


def autocast_like_accelerate(model, dtype: torch.dtype):
    """Wrap model.forward in autocast as Accelerate.prepare_model does (inside the module's hooks, so
    the weight casts it caches are dropped before the forward hooks run, as on a real job)."""
    from types import MethodType

    from accelerate.utils import convert_outputs_to_fp32

    forward = torch.autocast("cpu", dtype=dtype)(model.forward.__func__)
    model.forward = MethodType(convert_outputs_to_fp32(forward), model)
    return model


@contextlib.contextmanager
def cuda_kernels():
    """For a CUDA profile: run the kernels a GPU would, where they differ from the CPU's in memory.

    The trace runs on CPU fake tensors, so PyTorch would pick its CPU kernels: dropout keeping a
    float mask of the input's size (CUDA: a bool mask) and SDPA falling back to the math path when
    training with dropout (the full attention matrix; CUDA: the memory-efficient kernel keeps only
    its log-sum-exp). Both CUDA ops have shape functions, so they run on fake CPU tensors.
    """
    import torch.nn.functional as F

    dropout, sdpa = F.dropout, F.scaled_dot_product_attention

    def cuda_dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return dropout(input, p, training, inplace)
        return torch.ops.aten.native_dropout(input, p, True)[0]  # what at::dropout calls on CUDA

    def cuda_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if enable_gqa:
            return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        if torch.is_autocast_enabled("cpu"):  # autocast casts F.scaled_dot_product_attention's inputs, not the op's
            dtype = torch.get_autocast_dtype("cpu")
            query, key, value = (t.to(dtype) for t in (query, key, value))
        bias = attn_mask
        if bias is not None and bias.dtype == torch.bool:  # as ATen does before its CUDA kernels
            bias = torch.zeros(bias.shape, dtype=query.dtype).masked_fill(~bias, float("-inf"))
        if bias is not None:
            bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, needs_grad, dropout_p, is_causal, scale=scale)[0]

    F.dropout, F.scaled_dot_product_attention = cuda_dropout, cuda_sdpa
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention = dropout, sdpa


# CUDA autocast runs these in float32 where CPU autocast leaves them in the input's 16-bit dtype (PyTorch's AMP
# reference, "CUDA Ops that can autocast to float32", and aten/src/ATen/autocast_mode.h: AT_FORALL_FP32 and
# AT_FORALL_FP32_SET_OPT_DTYPE; the CPU's lists hold neither softmax nor layer_norm): an eager attention's
# probabilities are float32 on a GPU, twice their 16-bit bytes, and so is what dropout makes of them.
CUDA_FP32_CAST = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "__pow__", "__rpow__", "__rtruediv__", "__rdiv__", "softplus", "layer_norm", "group_norm",
    "cosine_similarity", "dist", "pdist", "cdist", "renorm", "logsumexp", "normalize"})
CUDA_FP32_OUTPUT = frozenset({"softmax", "log_softmax", "softmin", "cumsum", "cumprod", "prod", "sum"})
CUDA_FP32 = CUDA_FP32_CAST | CUDA_FP32_OUTPUT


class CudaAutocast(torch.overrides.TorchFunctionMode):
    """CUDA autocast's float32 ops on the trace's CPU autocast: where the trace's autocast is on, the ops
    above run as CUDA's runs them. Cast ones get float32 copies of their 16-bit floating inputs
    (`cached_cast`); output ones run with dtype=float32 unless the call names a dtype (`set_opt_dtype`), a
    half softmax or log-softmax without a copy, as ATen's SoftMax.cpp does for a CUDA half input
    (`half_to_float`; a bfloat16 input is copied to float32 first). Out= and in-place calls are not
    autocast, as on a GPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in CUDA_FP32 or "out" in kwargs or not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        first = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("input")
        if not isinstance(first, torch.Tensor):
            return func(*args, **kwargs)
        low = (torch.float16, torch.bfloat16)
        with torch.autocast("cpu", enabled=False):
            if name in CUDA_FP32_CAST:
                cast = [a.float() if isinstance(a, torch.Tensor) and a.dtype in low else a for a in args]
                return func(*cast, **{k: v.float() if isinstance(v, torch.Tensor) and v.dtype in low else v
                                      for k, v in kwargs.items()})
            named = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)
            if first.dtype not in low or named:
                return func(*args, **kwargs)
            if name in ("softmax", "log_softmax") and first.dtype == torch.float16:
                dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
                if isinstance(dim, int):
                    aten = torch.ops.aten._softmax if name == "softmax" else torch.ops.aten._log_softmax
                    return aten(first, dim, True)
            return func(*args, **{**kwargs, "dtype": torch.float32})


@contextlib.contextmanager
def gpu_int8_matmul():
    """For a CUDA profile: LLM.int8 layers train through bitsandbytes' MatMul8bitLt, as on a GPU (on a CPU
    tensor bitsandbytes picks MatMul8bitFp, which dequantizes the weight), with its outlier threshold at
    0: the columns above it are found in the values (a size no fake kernel can know), so the trace keeps
    no outlier columns. Each layer's outlier input columns (tokens x a few features, fp16) are left out."""
    import sys

    if "bitsandbytes" not in sys.modules:  # no 8-bit layer in the model
        yield
        return
    import bitsandbytes as bnb
    from bitsandbytes.autograd._functions import MatMul8bitLt

    def matmul(A, B, out=None, state=None, threshold=0.0, bias=None):
        state.threshold = 0.0
        return MatMul8bitLt.apply(A, B, out, bias, state)

    original, bnb.matmul = bnb.matmul, matmul
    quiet = logging.getLogger("bitsandbytes.autograd._functions")  # "inputs will be cast to float16", per layer
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        bnb.matmul = original
        quiet.setLevel(level)


def save_on_host(recorder):
    """torch.autograd.graph.save_on_cpu as the trace runs it: every tensor saved for backward is copied
    to a block the recorder files as host memory (adjust.py takes host blocks off the device), the
    device's copy is left to die as save_on_cpu leaves it, and backward copies it back to the device."""
    def pack(t):
        host = t.detach().clone()
        recorder.tag(host, "host")
        return host

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda host: host.clone())


def to_fake(model, fake_mode):
    """Swap every meta tensor of the model for a fake CPU tensor of the same shape, dtype and
    requires_grad; tied weights stay tied. (The transforms run on meta first because
    `Module.to(dtype)` cannot swap fake parameters.)"""
    converter, cpu, fakes, params = fake_mode.fake_tensor_converter, torch.device("cpu"), {}, {}

    def fake(t):
        if id(t) not in fakes:
            fakes[id(t)] = converter.from_meta_and_device(fake_mode, t.detach(), cpu)
        return fakes[id(t)]

    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) not in params:
                    params[id(p)] = torch.nn.Parameter(fake(p), requires_grad=p.requires_grad)
                    params[id(p)].__dict__.update(p.__dict__)  # a bitsandbytes weight's quantization settings
                module._parameters[name] = params[id(p)]
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = fake(b)
    model.train()
    return model


@contextlib.contextmanager
def on_fake_tensors(model, setup, profile: HardwareConf):
    """The meta model on fake CPU tensors, autocast as Accelerate applies it, and for a CUDA profile
    the GPU's kernels: what the trace and the FLOP count both run under."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor

    # FSDP's sharded parameters (DTensors on meta) are made fake by to_empty, which reads the meta ones
    is_sharded = any(isinstance(p, DTensor) for p in model.parameters())
    fake_mode = FakeTensorMode(allow_non_fake_inputs=is_sharded)
    if not is_sharded:
        model = to_fake(model, fake_mode)
    if (dtype := accelerate_dtype(setup)) is not None:
        model = autocast_like_accelerate(model, dtype)
    with torch.random.fork_rng(), fake_mode, contextlib.ExitStack() as kernels:
        if profile.device == "cuda":
            kernels.enter_context(cuda_kernels())
            kernels.enter_context(CudaAutocast())
            kernels.enter_context(gpu_int8_matmul())
        if is_sharded:
            # to_empty makes plain tensors of the unsharded 4-bit weights (sharded.py leaves them whole):
            # their quantization settings are carried over, as to_fake does
            settings = {m: dict(vars(m.weight)) for m in model.modules() if type(m).__name__ == "Linear4bit"}
            model.to_empty(device="cpu").train()
            for module, kept in settings.items():
                module.weight.__dict__.update(kept)
        quantize_bitsandbytes(model, fake_mode)
        kernels.enter_context(gemm_4bit_dequantized())
        yield model


@contextlib.contextmanager
def gemm_4bit_dequantized():
    """bitsandbytes' 4-bit matmul (the op gemm_4bit, whose fake kernel makes only its output) run as the library's
    own dequantize-then-linear kernel, so the trace sees the whole weight dequantized for an instant: what a CPU runs,
    a GPU's fallback, and every 4-bit forward before gemm_4bit (docs/estimator/validation.md). Where a GPU's fused
    kernel runs instead, that weight is counted anyway: the safe side."""
    import sys

    if "bitsandbytes" not in sys.modules or not hasattr(torch.ops.bitsandbytes, "gemm_4bit"):
        yield  # no 4-bit layer, or a bitsandbytes whose forward dequantizes in Python (seen as it is)
        return
    from bitsandbytes.backends.default.ops import _gemm_4bit_default_impl

    packet = torch.ops.bitsandbytes.gemm_4bit
    fused = packet.default
    packet.default = _gemm_4bit_default_impl
    try:
        yield
    finally:
        packet.default = fused


def quantize_bitsandbytes(model, fake_mode) -> None:
    """Quantize each bitsandbytes layer's fake weight as Params4bit / Int8Params do when moved to a
    device (their _quantize), with bitsandbytes' own ops, whose fake kernels give the packed shapes. A
    tensor subclass cannot wrap a fake tensor, so the weight becomes a frozen Parameter carrying what
    the layer's forward reads: quant_state (4-bit); CB and SCB (8-bit)."""
    import sys

    if "bitsandbytes" not in sys.modules:  # nothing of it in the model
        return
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    with dynamic_map(F, fake_mode):
        quantize_layers(model, bnb, F)


def quantize_layers(model, bnb, F) -> None:
    """Each 4-bit and 8-bit layer's weight quantized in place (see quantize_bitsandbytes)."""
    for module in model.modules():
        w = getattr(module, "weight", None)
        if isinstance(module, bnb.nn.Linear4bit):
            packed, state = F.quantize_4bit(w, blocksize=w.blocksize, compress_statistics=w.compress_statistics,
                                            quant_type=w.quant_type, quant_storage=w.quant_storage)
            module.weight = torch.nn.Parameter(packed, requires_grad=False)
            module.weight.quant_state = module.quant_state = state
        elif isinstance(module, bnb.nn.Linear8bitLt):
            CB, SCB, _ = F.int8_vectorwise_quant(w.to(torch.float16))
            module.weight = torch.nn.Parameter(CB, requires_grad=False)
            module.weight.__dict__.update(CB=CB, SCB=SCB, has_fp16_weights=False)


@contextlib.contextmanager
def dynamic_map(F, fake_mode):
    """bitsandbytes' 256-entry dynamic map, which double quantization quantizes the 4-bit block scales with,
    as a fake tensor where bitsandbytes caches it while the layers are quantized (its values are computed,
    so it is made outside fake mode); bitsandbytes' own cache is left as it was."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    kept = F.name2qmap.get("dynamic")
    with unset_fake_temporarily():
        real = kept if kept is not None else F.create_dynamic_map()
    F.name2qmap["dynamic"] = fake_mode.from_tensor(real)
    try:
        yield
    finally:
        if kept is None:
            del F.name2qmap["dynamic"]
        else:
            F.name2qmap["dynamic"] = kept
