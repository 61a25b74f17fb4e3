"""Predict a job's peak memory, FLOPs and step time without training it (`mode=estimate`, every real
job's `estimate`, `autofit`, and `python -m memsweep.estimate`).

Two estimators, both reported:
- trace (trace.py; the answer where it runs): a training step of the job's real model on fake
  tensors, measured by the same tracker as real jobs. Exact on the CPU.
- closed form (closed_form.py with inventory.py and activations.py): bytes per parameter and per
  activation from the architecture, for what the trace cannot run (DeepSpeed, FSDP with CPU offload,
  activation offload, LLM.int8 on a GPU) and as a cross-check everywhere else.

arch.py sizes the model from its config, core.py assembles an estimate, autofit.py picks a
micro-batch, table.py prints and tabulates, __main__.py is the CLI.
"""
