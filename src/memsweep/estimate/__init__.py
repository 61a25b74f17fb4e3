"""Predict a job's peak memory, FLOPs and step time without training it (`mode=estimate`, every real
job's `estimate`, `autofit`, and `python -m memsweep.app.estimate`).

One memory model: a training step of the job's real model on fake tensors, measured by the same tracker
as real jobs (exact on the CPU), its allocations replayed through a model of the CUDA caching allocator
on a GPU profile. Where the trace cannot run the job as it is, the answer is the trace of the nearest
job it can run, adjusted by arithmetic whose mechanism and source are named (adjust.py).

The recipe (core.estimate_job): setup -> model (meta.py: a copy of the job's meta model with the setup's
transforms) -> trace (trace.py, on fake.py's fake tensors, one step as step.py runs it; sharded.py for
FSDP's fake ranks; capture.py records allocations for allocator.py) or adjust -> device counters -> fit
(result.Estimate). autofit.py picks a micro-batch, table.py prints an estimate's line and row. The method,
mechanism by mechanism with its sources: docs/estimator/.
"""

# A job's estimate (mode=estimate, or the estimate CLI): here, so the sweep dir's reader names it without importing
# the estimator (and torch).
ESTIMATE_FILE = "estimate.json"
