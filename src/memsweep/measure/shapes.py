"""Tensor-core shapes: on a GPU profile with a shape rule (`hardware.tensor_core_multiple`: 8 on a T4,
64 on an A100 for fp16), flag a micro-batch, sequence length or vocabulary size that is not a multiple
of it, with one line of advice. Matmuls whose dimensions are not multiples fall back to slower kernels.

The sequence length the model sees is the padded batch length: DataCollatorWithPadding pads each batch
to its longest example, so it is a multiple only when `data.pad_to_multiple_of` makes it one. An image task
has neither padding nor a vocabulary (its sequence is the model's patch grid): only its micro-batch is flagged.
"""
from typing import Any

ADVICE = ("pad the vocabulary (resize_token_embeddings(pad_to_multiple_of={m})) and the sequence length "
          "(data.pad_to_multiple_of={m}) and pick micro-batch sizes that are multiples of {m} on {profile} "
          "so matmuls use tensor cores")
IMAGE_ADVICE = "pick micro-batch sizes that are multiples of {m} on {profile} so matmuls use tensor cores"


def flags(multiple: int, micro_batch: int, vocab_size: int | None, pad_to_multiple_of: int | None,
          images: bool = False) -> dict[str, str]:
    """{what: why} for each shape that is not a multiple of `multiple` (empty when all are, or no rule)."""
    if multiple <= 0:
        return {}
    found = {}
    if micro_batch % multiple:
        found["micro-batch"] = f"micro-batch {micro_batch} is not a multiple of {multiple}"
    if images:  # no padding, no vocabulary
        return found
    if pad_to_multiple_of is None:
        found["sequence length"] = (f"sequence length: each batch is padded to its longest example, not to a "
                                    f"multiple of {multiple} (data.pad_to_multiple_of is null)")
    elif pad_to_multiple_of % multiple:
        found["sequence length"] = (f"sequence length: data.pad_to_multiple_of={pad_to_multiple_of} is not a "
                                    f"multiple of {multiple}")
    if vocab_size is not None and vocab_size % multiple:  # an image model has no vocabulary
        found["vocabulary"] = f"vocabulary size {vocab_size} is not a multiple of {multiple}"
    return found


def audit(profile, micro_batch: int, vocab_size: int | None, pad_to_multiple_of: int | None,
          images: bool = False) -> dict[str, Any] | None:
    """results.json `shape_advice`: None when the profile has no tensor-core rule (a CPU)."""
    multiple = profile.tensor_core_multiple
    if multiple <= 0:
        return None
    found = flags(multiple, micro_batch, vocab_size, pad_to_multiple_of, images)
    advice = IMAGE_ADVICE if images else ADVICE
    return {"multiple": multiple, "not_multiples": list(found), "flags": list(found.values()),
            "advice": advice.format(m=multiple, profile=profile.name) if found else None}


def cell(shape_advice: dict[str, Any] | None) -> str:
    """A sweep table's cell: what is not a multiple, "ok", or "-" without a rule."""
    if not shape_advice:
        return "-"
    return ", ".join(shape_advice["not_multiples"]) or f"ok (x{shape_advice['multiple']})"


def table_notes(advices: list[dict[str, Any] | None]) -> list[str]:
    """One advice line per distinct advice of a sweep's jobs, for under its table."""
    found = dict.fromkeys(a["advice"] for a in advices if a and a["advice"])
    return [f"tensor-core shapes: {advice}" for advice in found]


def lines(shape_advice: dict[str, Any] | None) -> list[str]:
    """The flags and the advice for a printed summary (nothing when all is well)."""
    if not shape_advice or not shape_advice["flags"]:
        return []
    return ([f"  tensor cores (multiples of {shape_advice['multiple']}): " + "; ".join(shape_advice["flags"])]
            + [f"  advice: {shape_advice['advice']}"])
