"""An estimate as people read it: the one line a job prints, and its row in a table of estimates
(sweep/estimates.py lays a sweep's rows out as estimate.md)."""
from typing import Any

from ..measure import shapes

GIB = 2**30


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def shape(est: dict[str, Any], images: bool = False) -> str:
    """The shape an estimate answers for: micro-batch x sequence length, or of an image task the micro-batch
    in images (max_seq_len does not apply to them); and the accumulation steps."""
    steps = est.get("accumulation_steps") or 1
    batch = (f"micro-batch {est.get('micro_batch_size')} images" if images
             else f"micro-batch {est.get('micro_batch_size')} x {est.get('seq_len')} tokens")
    return batch + (f" x {steps} accumulation steps" if steps > 1 else "")


def summary_line(est: dict[str, Any], images: bool = False) -> str:
    """The lines a job prints for its estimate: the answer for its shape (`images`: an image task's), and the
    tensor-core flags and advice."""
    fits = {True: "fits", False: "DOES NOT FIT", None: "capacity unknown"}[est["fits"]]
    time_s = _predicted_time(est)
    # on a GPU the total takes reserved on the safe side of packing: both figures shown
    packing = (f" (reserved {_gib(est['peak_reserved_bytes'])} GiB, upper {_gib(est['reserved_upper_bytes'])} GiB)"
               if est.get("reserved_upper_bytes") is not None else "")
    return "\n".join([f"[memsweep] estimate ({est['method']}) on {est['hardware']} for {shape(est, images)}: "
                      f"{_gib(est['total_bytes'])} GiB{packing} of {_gib(est['capacity_bytes'])} GiB, {fits}; "
                      f"{est['flops_per_step'] / 1e12:.2f} TFLOP/step, {time_s}",
                      *shapes.lines(est.get("shape_advice"))])


def _predicted_time(est: dict[str, Any]) -> str:
    """The predicted step time and what paces it (roofline.py), else FLOPs at the peak rate."""
    if est.get("predicted_step_s"):
        bound = (est.get("step_time") or {}).get("bound")
        return f"{est['predicted_step_s'] * 1e3:.1f} ms/step predicted" + (f" ({bound})" if bound else "")
    return "-" if est["step_time_s"] is None else f"{est['step_time_s'] * 1e3:.1f} ms/step at peak"


TABLE_PARTS = ("params", "grads", "optimizer", "activations", "temp", "overhead")


def estimate_row(est: dict[str, Any], with_shapes: bool) -> dict[str, str]:
    bd = est["breakdown"]
    parts = {**bd, "temp": bd.get("temp", 0) + bd.get("buffers", 0) + bd.get("other", 0)}
    row = {"method": est["method"], "total GiB": _gib(est["total_bytes"]),
           **({"allocated GiB": _gib(est["peak_allocated_bytes"]), "reserved GiB": _gib(est["peak_reserved_bytes"]),
               "reserved upper GiB": _gib(est.get("reserved_upper_bytes")),
               "used GiB": _gib(est["device_used_bytes"])} if est["device"] == "cuda" else {}),
           **{p: _gib(parts.get(p, 0)) for p in TABLE_PARTS},
           "capacity GiB": _gib(est["capacity_bytes"]), "fits": {True: "yes", False: "**no**", None: "?"}[est["fits"]],
           "margin GiB": _gib(est["margin_bytes"]),
           "TFLOP/step": f"{est['flops_per_step'] / 1e12:.2f}",
           "ms/step predicted": "-" if not est.get("predicted_step_s") else f"{est['predicted_step_s'] * 1e3:.1f}",
           "ms/step at peak": "-" if est["step_time_s"] is None else f"{est['step_time_s'] * 1e3:.1f}"}
    if with_shapes:
        row["not a tensor-core multiple"] = shapes.cell(est.get("shape_advice"))
    return row
