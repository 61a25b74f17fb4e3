"""bitsandbytes' 4-bit path op by op on the CPU: what one Linear4bit with peft's LoRA beside it allocates and keeps
for backward, really and in the estimate's fake-tensor trace, side by side.

Real: torch's profiler with profile_memory=True records every allocation and free of the CPU allocator, inside
a custom op's kernel too (bitsandbytes' gemm_4bit dequantizes its weight there), each with the ops it ran under.
Trace: the estimate's own path (fake.on_fake_tensors quantizes the fake weight with bitsandbytes' ops, the
Recorder of capture.py records the step's blocks). Each side also lists what autograd saved
(saved_tensors_hooks). Allocations a CPU matmul makes and frees inside itself (oneDNN's scratch for a bf16
matmul; cuBLAS's workspace on a GPU, which the estimate counts apart) and Python numbers wrapped as 0-dim CPU
tensors are shown but left out of the sums.

    .venv/bin/python benchmarks/qlora_ops.py [--double-quant] [--tokens 128] [--model]

`--model` adds a tiny llama with lora=qlora, traced and run on the CPU: one step's peak by the ledger and by the
trace. Findings: benchmarks/DIARY.md (2026-12-02) and docs/estimator/validation.md.
"""
import argparse
import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

IN_FEATURES, OUT_FEATURES = 256, 512
# matmul kernels whose own scratch a CPU allocates and frees inside the op: oneDNN's for a bf16 matmul (on a GPU,
# cuBLAS's workspace, which the estimate counts apart: capture.cublas_workspace_bytes)
MATMUL_NAMES = frozenset({"mm", "bmm", "addmm", "baddbmm"})
MATMUL_SCRATCH = "matmul scratch"
# a Python number wrapped as a 0-dim CPU tensor (dropout's scale, LoRA's scaling): host memory on a GPU job too
HOST_SCALAR, HOST_SCALAR_BYTES = "host scalar", 8
# ops that only make the storage another op asked for: an allocation is the op above them
MAKERS = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                    "aten::new_empty_strided", "aten::zeros_like", "aten::zeros", "aten::ones_like"})


@dataclass
class Block:
    """One allocation of the step: when (forward or backward), by which op, its bytes, and whether it is still
    alive when the forward ends (kept for backward, or the output)."""
    phase: str
    op: str
    nbytes: int
    scratch: str = ""  # why a trace does not hold it (empty: a tensor it holds)
    alive_after_forward: bool = False
    made_in: str = ""  # the innermost op it was made in (real side)


@dataclass
class Reading:
    """One side's step: its blocks in order, the peak above what was alive before the step, what autograd saved
    (bytes of distinct storages made in the forward), and the forward's output bytes."""
    blocks: list[Block] = field(default_factory=list)
    peak_bytes: int = 0
    forward_peak_bytes: int = 0
    saved_bytes: int = 0
    output_bytes: int = 0

    @property
    def kept_bytes(self) -> int:
        """What the forward leaves alive besides its output: what the backward will read."""
        return sum(b.nbytes for b in self.blocks if b.alive_after_forward and not b.scratch) - self.output_bytes


def lora_layer(device: str, double_quant: bool, dropout: float = 0.05):
    """One bitsandbytes NF4 Linear4bit computing in bf16, in a module peft wraps with its bnb LoRA layer (r 8, the
    adapters in fp32 as peft keeps them). On "cpu" the weight is quantized as Params4bit does when moved there; on
    "meta" it is left for the trace to quantize (fake.quantize_bitsandbytes)."""
    import bitsandbytes as bnb
    from peft import LoraConfig, get_peft_model

    class OneLayer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = bnb.nn.Linear4bit(IN_FEATURES, OUT_FEATURES, bias=False, compute_dtype=torch.bfloat16,
                                          quant_type="nf4", compress_statistics=double_quant, device=device)

        def forward(self, x):
            return self.proj(x)

    torch.manual_seed(0)
    model = OneLayer()
    model.is_loaded_in_4bit = True  # what transformers' quantizer marks, and peft dispatches its bnb layer on
    weight = torch.randn(OUT_FEATURES, IN_FEATURES, dtype=torch.bfloat16, device=device)
    model.proj.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4",
                                          compress_statistics=double_quant)
    if device == "cpu":
        model.proj.weight = model.proj.weight._quantize("cpu")  # what .to("cpu") does for an unquantized one
    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout, target_modules=["proj"]))


@contextlib.contextmanager
def saved_storages(out: dict):
    """Every storage autograd saves a tensor of (save_for_backward, a node's inputs) while the forward runs, by its
    address, with its bytes: nothing is held, so each is freed where the backward frees it. (The graph holds them
    alive through the forward, so no address is reused within it.)"""
    def pack(t):
        storage = t.untyped_storage()
        out[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def saved_bytes(saved: dict, before: set) -> int:
    """Bytes of the storages saved that the forward made (not the weights or the input)."""
    return sum(nbytes for address, nbytes in saved.items() if address not in before)


def step(model, x) -> tuple[torch.Tensor, dict]:
    """The layer's forward (its output kept, as the next layer would) and what autograd saved in it."""
    saved: dict = {}
    with saved_storages(saved):
        y = model(x)
    return y, saved


def real(double_quant: bool, tokens: int) -> Reading:
    """The layer's step on the CPU, each allocation as torch's profiler saw it."""
    from torch.profiler import ProfilerActivity, profile

    model = lora_layer("cpu", double_quant)
    x = torch.randn(1, tokens, IN_FEATURES, dtype=torch.bfloat16, requires_grad=True)
    before = {p.untyped_storage()._cdata for p in model.parameters()} | {x.untyped_storage()._cdata}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.profiler.record_function("## forward"):
            y, saved = step(model, x)
        with torch.profiler.record_function("## backward"):
            y.backward(torch.ones_like(y))
    reading = profiled(prof)
    reading.saved_bytes, reading.output_bytes = saved_bytes(saved, before), y.untyped_storage().nbytes()
    return reading


def profiled(prof) -> Reading:
    """The blocks of a profile: each allocation attributed to the op that asked for it and matched with its free;
    the peak above the step's start counts the blocks a trace can see (not `Block.scratch` ones)."""
    reading, open_blocks, timeline = Reading(), {}, []  # timeline: (block, +1 made / -1 freed)
    forward_end = None
    for size, ptr, stack in allocations(prof):
        if forward_end is None and "## backward" in stack:  # what is open now, the forward left alive
            forward_end = True
            for block in open_blocks.values():
                block.alive_after_forward = block.phase == "forward"
        if size > 0:
            ops = [name for name in stack if not name.startswith("##") and name not in MAKERS]
            block = Block("backward" if "## backward" in stack else "forward", short(ops[-1] if ops else "?"), size,
                          scratch=HOST_SCALAR if size <= HOST_SCALAR_BYTES else "", made_in=stack[-1] if stack else "")
            reading.blocks.append(block)
            open_blocks[ptr] = block
            timeline.append((block, 1))
        elif ptr in open_blocks:
            block = open_blocks.pop(ptr)
            if block.op in MATMUL_NAMES and stack and stack[-1] == block.made_in:  # freed inside the op that made it
                block.scratch = block.scratch or MATMUL_SCRATCH
            timeline.append((block, -1))
    live = 0
    for block, sign in timeline:
        live += 0 if block.scratch else sign * block.nbytes
        reading.peak_bytes = max(reading.peak_bytes, live)
        if block.phase == "forward" and sign > 0:
            reading.forward_peak_bytes = max(reading.forward_peak_bytes, live)
    return reading


def allocations(prof) -> list[tuple[int, int, list[str]]]:
    """(bytes, address, the ops it ran under) of every allocation (bytes > 0) and free (< 0), in time order."""
    from torch._C._profiler import _EventType

    events = []

    def walk(node, stack):
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size, node.extra_fields.ptr, stack))
        for child in node.children:
            walk(child, stack + [node.name])

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, [])
    return [(size, ptr, stack) for _, size, ptr, stack in sorted(events, key=lambda e: e[0])]


def short(name: str) -> str:
    """An op's name without its namespace and overload: aten::mm, aten.mm.default -> mm."""
    name = name.replace("::", ".")
    parts = name.split(".")
    if parts[0] in ("aten", "bitsandbytes", "prims") and len(parts) > 1:
        return parts[1]
    return name


def traced(double_quant: bool, tokens: int) -> Reading:
    """The layer's step as the estimate traces it: the meta layer on fake tensors (fake.on_fake_tensors), its
    blocks by the Recorder (capture.py), which sees what the step's ops make."""
    from memsweep.config.choices import Device
    from memsweep.config.schema import HardwareConf
    from memsweep.estimate import capture, fake

    model = lora_layer("meta", double_quant)
    with fake.on_fake_tensors(model, NoSetup(), HardwareConf(device=Device.cpu)) as model:
        x = torch.randn(1, tokens, IN_FEATURES, dtype=torch.bfloat16, requires_grad=True)
        before = {p.untyped_storage()._cdata for p in model.parameters()} | {x.untyped_storage()._cdata}
        recorder = naming_recorder_class()(capture.alive_at_step(model, None) + [("activations", x)])
        with recorder:
            recorder.phase_name = "forward"
            y, saved = step(model, x)
            recorder.forward_end = len(recorder.events)
            recorder.phase_name = "backward"
            y.backward(torch.ones_like(y))
        reading = recorder.reading()
        reading.saved_bytes, reading.output_bytes = saved_bytes(saved, before), y.untyped_storage().nbytes()
    return reading


class NoSetup:
    """What fake.on_fake_tensors reads of a job's setup: no autocast (the layer computes in bf16 itself)."""
    args: dict = {}


def naming_recorder_class():
    """capture.Recorder with each block's op and phase (made on first use: memsweep is imported only to trace)."""
    from memsweep.estimate.capture import Recorder

    class Naming(Recorder):
        """The estimate's Recorder, each block named by the op that made it."""

        def __init__(self, tensors):
            super().__init__(tensors)
            self.op_of, self.current, self.phase_name, self.forward_end = {}, "?", "forward", 0
            self.seed_keys = []

        def __enter__(self):
            out = super().__enter__()
            self.seed_keys = [e.key for e in self.events]
            return out

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.current = short(str(func))
            return super().__torch_dispatch__(func, types, args, kwargs)

        def allocate(self, block, nbytes, category=None):
            super().allocate(block, nbytes, category)
            if nbytes:
                self.op_of[block.key] = (self.phase_name, self.current)

        def reading(self) -> Reading:
            """The recorded step's blocks (not those alive before it), its peaks and what the forward left."""
            reading, blocks, live, freed_in_forward = Reading(), {}, 0, set()
            for n, event in enumerate(self.events):
                if event.key in self.seed_keys:
                    continue
                if event.kind == "alloc" and event.nbytes:
                    phase, op = self.op_of[event.key]
                    blocks[event.key] = block = Block(phase, op, event.nbytes)
                    reading.blocks.append(block)
                    live += event.nbytes
                    reading.peak_bytes = max(reading.peak_bytes, live)
                    if phase == "forward":
                        reading.forward_peak_bytes = max(reading.forward_peak_bytes, live)
                elif event.kind == "free" and event.key in blocks:
                    live -= blocks[event.key].nbytes
                    if n < self.forward_end:
                        freed_in_forward.add(event.key)
            for key, block in blocks.items():
                block.alive_after_forward = block.phase == "forward" and key not in freed_in_forward
            return reading

    return Naming


def table(real_reading: Reading, traced_reading: Reading) -> str:
    """The two sides' blocks in order, side by side, aligned where phase and bytes agree (difflib); a block one
    side has and the other lacks stands alone. Then the sums."""
    import difflib

    rows = ["| # | phase | real op | real bytes | kept | traced op | traced bytes | kept |",
            "|---|---|---|---|---|---|---|---|"]
    # the blocks a trace can hold are aligned; the real side's others follow the block made before them
    left = [b for b in real_reading.blocks if not b.scratch]
    after = {}
    for n, block in enumerate(real_reading.blocks):
        if block.scratch:
            previous = next((b for b in reversed(real_reading.blocks[:n]) if not b.scratch), None)
            after.setdefault(id(previous), []).append(block)
    right = traced_reading.blocks
    matcher = difflib.SequenceMatcher(None, [(b.phase, b.nbytes) for b in left], [(b.phase, b.nbytes) for b in right],
                                      autojunk=False)
    pairs = [(a, None) for a in after.get(id(None), [])]
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for a, b in zip(left[i1:i2], right[j1:j2]):
                pairs += [(a, b)] + [(extra, None) for extra in after.get(id(a), [])]
        else:
            for a in left[i1:i2]:
                pairs += [(a, None)] + [(extra, None) for extra in after.get(id(a), [])]
            pairs += [(None, b) for b in right[j1:j2]]
    rows += [row(n, a, b) for n, (a, b) in enumerate(pairs)]
    rows += ["", f"forward's peak above the step's start: real {real_reading.forward_peak_bytes:,} B, traced "
                 f"{traced_reading.forward_peak_bytes:,} B",
             f"peak above the step's start: real {real_reading.peak_bytes:,} B (left out: matmul scratch, host "
                 f"scalars), traced {traced_reading.peak_bytes:,} B",
             f"kept for backward at the forward's end (besides the output): real {real_reading.kept_bytes:,} B, "
             f"traced {traced_reading.kept_bytes:,} B",
             f"saved by autograd (saved_tensors_hooks, storages the forward made): real "
             f"{real_reading.saved_bytes:,} B, traced {traced_reading.saved_bytes:,} B"]
    return "\n".join(rows)


def row(n: int, a: Block | None, b: Block | None) -> str:
    def cells(block: Block | None) -> str:
        if block is None:
            return " | – | "
        note = f" ({block.scratch})" if block.scratch else ""
        return f"{block.op}{note} | {block.nbytes:,} | {'yes' if block.alive_after_forward else ''}"

    phase = (a or b).phase
    return f"| {n} | {phase} | {cells(a)} | {cells(b)} |"


TINY_QLORA = ["task=causal_lm", "model=tiny-llama", "lora=qlora", "batch_size=4", "max_seq_len=32", "precision=fp32",
              "checkpointing=none", "threads=1", "logger=none"]


def real_model(overrides: list[str], job_dir: Path) -> Reading:
    """The job's real model (built as the job builds it) through one micro-batch on the CPU, profiled."""
    from torch.profiler import ProfilerActivity, profile

    from memsweep.app.estimate import compose
    from memsweep.config import hardware
    from memsweep.estimate.step import fake_batch
    from memsweep.run.train_loop import build

    job = compose(overrides)
    model = build(job, hardware.detect(job.hardware), job_dir).trainer.model.train()
    batch = fake_batch(model, job.batch_size, job.max_seq_len, "causal_lm")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.profiler.record_function("## forward"):
            loss = model(**batch).loss
        with torch.profiler.record_function("## backward"):
            loss.backward()
    return profiled(prof)


def traced_model(overrides: list[str]) -> Reading:
    """The same micro-batch as the estimate traces it: the job's meta model on fake tensors, the Recorder."""
    from memsweep.app.estimate import compose
    from memsweep.config import hardware
    from memsweep.estimate import capture, fake, meta
    from memsweep.estimate.step import fake_batch
    from memsweep.run.setup import build_setup

    job = compose(overrides)
    profile = hardware.detect(job.hardware)
    setup = build_setup(job, profile)
    with fake.on_fake_tensors(meta.traced_model(job, setup), setup, profile) as model:
        batch = fake_batch(model, job.batch_size, job.max_seq_len, "causal_lm")
        recorder = naming_recorder_class()(capture.alive_at_step(model, None) + [("activations", t)
                                                                                 for t in batch.values()])
        with recorder:
            loss = model(**batch).loss
            recorder.forward_end, recorder.phase_name = len(recorder.events), "backward"
            loss.backward()
        return recorder.reading()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--double-quant", action="store_true", help="double quantization of the block scales")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--model", action="store_true", help="also a tiny llama with lora=qlora, one micro-batch")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    r, t = real(args.double_quant, args.tokens), traced(args.double_quant, args.tokens)
    print(f"one Linear4bit({IN_FEATURES} -> {OUT_FEATURES}, nf4, double_quant={args.double_quant}, bf16 compute) "
          f"+ peft LoRA r 8 (fp32 adapters, dropout 0.05), {args.tokens} tokens, bitsandbytes "
          f"{__import__('bitsandbytes').__version__}")
    print(table(r, t))
    if args.model:
        import tempfile

        with tempfile.TemporaryDirectory() as job_dir:
            r = real_model(TINY_QLORA, Path(job_dir))
        t = traced_model(TINY_QLORA)
        print(f"\n{' '.join(TINY_QLORA)}: one micro-batch, forward and backward")
        print(f"peak above the step's start: real {r.peak_bytes:,} B, traced {t.peak_bytes:,} B; forward's: real "
              f"{r.forward_peak_bytes:,} B, traced {t.forward_peak_bytes:,} B; kept at the forward's end: real "
              f"{sum(b.nbytes for b in r.blocks if b.alive_after_forward and not b.scratch):,} B, traced "
              f"{sum(b.nbytes for b in t.blocks if b.alive_after_forward):,} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
