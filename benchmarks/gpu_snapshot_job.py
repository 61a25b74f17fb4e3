"""One memsweep job under a whole-run CUDA memory snapshot (every allocation and segment, Python stacks of the
allocations), written xz-compressed:

    python benchmarks/gpu_snapshot_job.py OUT.pickle.xz [train.py overrides ...]

torch's default recording (context and stacks "all": the frees' stacks and C++ frames too) made the first
backward of an fp16 + Adafactor + full checkpointing job fail inside autograd's engine on torch 2.11 on an
H200 ("returned NULL without setting an exception"); the allocations' Python stacks alone (below) ran.
"""
import lzma
import pickle
import runpy
import sys

import torch

out = sys.argv[1]
torch.cuda.memory._record_memory_history(max_entries=2_000_000, context="alloc", stacks="python")
sys.argv = ["train.py"] + sys.argv[2:]
try:
    runpy.run_path("train.py", run_name="__main__")
except SystemExit as exc:
    print("exit", exc.code)
finally:
    snap = torch.cuda.memory._snapshot()
    with lzma.open(out, "wb") as f:
        pickle.dump(snap, f)
    print("snapshot events", sum(len(t) for t in snap["device_traces"]))
