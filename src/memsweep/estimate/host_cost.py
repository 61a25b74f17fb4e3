"""What one op of a model's forward and backward costs the host, relative to BERT's: the host's time per op
(roofline.HOST_S_PER_OP on a GPU, measured on bert-base's steps; on a CPU, a tiny BERT's measured at start-up)
is modules' Python, autograd and the dispatcher, and an architecture's modules do more or less of it per op.
Measured on this project's CPU (benchmarks/host_per_op.py -> host_per_op.json, each architecture at tiny
widths and 12 blocks, where its ops do next to no work): Llama-family decoders 0.64-0.69 of BERT's (their
RMSNorm and SwiGLU are several plain ops in one module), GPT-2 0.97, DistilBERT 1.08, DINOv2 1.24, ViT 1.39
(more modules' Python around fewer ops). A file, not a measurement per process: a GPU estimate must
be the same from run to run. An architecture not measured takes BERT's."""
import functools
import json
from pathlib import Path

MEASURED = Path(__file__).with_name("host_per_op.json")
REFERENCE = "bert"


@functools.lru_cache(maxsize=1)
def per_op_us() -> dict:
    return json.loads(MEASURED.read_text())["us_per_op"]


def relative(model_type: str | None) -> float:
    """The architecture's host cost per op over BERT's (1 where it was not measured)."""
    costs = per_op_us()
    return costs.get(model_type, costs[REFERENCE]) / costs[REFERENCE]
