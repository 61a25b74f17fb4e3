"""What one op of a model's forward and backward costs the host beyond its work, per architecture, on this CPU.

    python benchmarks/host_per_op.py --out src/memsweep/estimate/host_per_op.json
    python benchmarks/host_per_op.py --check     # this CPU's ratios against the committed file's; exit 1 if off

Each architecture stepped at tiny widths, where an op does next to no work, one thread: its time over the ops
the roofline counts, relative to BERT's. Method: docs/guide/benchmarks.md.
"""
import argparse
import datetime
import json
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's memsweep

ARCHITECTURES = {"bert": "classification", "distilbert": "classification", "roberta": "classification",
                 "llama": "causal_lm", "mistral": "causal_lm", "qwen2": "causal_lm", "phi": "causal_lm",
                 "stablelm": "causal_lm", "gpt2": "causal_lm", "vit": "image_classification",
                 "dinov2": "image_classification"}


# widths under names of the architecture's own that the size keys (run/model.SIZE_KEYS) do not reach, and images
# of a few patches: at these sizes the ops do next to no work
SMALL = {"distilbert": {"hidden_dim": 64}, "vit": {"image_size": 32, "patch_size": 16},
         "dinov2": {"image_size": 28, "patch_size": 14}}


def stepper(model_type: str, task_name: str):
    """(a forward and backward of the architecture at tiny widths, the ops it counts)."""
    from memsweep.config.choices import TaskName
    from memsweep.config.schema import ModelConf, ModelSource, TaskConf
    from memsweep.estimate.step import fake_batch
    from memsweep.measure import peak
    from memsweep.run.model import hf_config
    from memsweep.run.task import auto_class

    cfg = ModelConf(source=ModelSource.tiny, architecture=model_type, hidden_size=32, num_layers=12, num_heads=2,
                    num_kv_heads=2, intermediate_size=64, vocab_size=256,
                    overrides={"pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0, **SMALL.get(model_type, {})})
    task = TaskConf(name=TaskName(task_name))
    config, _ = hf_config(cfg, num_labels=2 if task_name != "image_classification" else 10)
    model = auto_class(task).from_config(config).train()
    batch = fake_batch(model, 1, 8, task_name)

    def step():
        model(**batch).loss.backward()
        model.zero_grad(set_to_none=True)

    return step, peak.ops_in(step)


def per_op_us(architectures: dict, rounds: int = 5) -> dict:
    """Microseconds per op of each architecture: the median of `rounds` rounds of 0.5 s, the architectures taking
    turns in each round, so that a change in the machine's speed moves them alike."""
    from memsweep.measure import peak

    steps = {arch: stepper(arch, task) for arch, task in architectures.items()}
    times = {arch: [] for arch in architectures}
    for _ in range(rounds):
        for arch, (step, ops) in steps.items():
            times[arch].append(1e6 * peak.median_seconds(step, 0.5) / ops)
    return {arch: round(statistics.median(t), 2) for arch, t in times.items()}


def disagreements(measured: dict, committed: dict, reference: str = "bert", tolerance: float = 0.25) -> dict:
    """{architecture: (measured, committed)} of the architectures whose cost relative to the reference's differs
    from the committed one's by more than `tolerance`: ratios, since a machine's speed moves both sides."""
    off = {}
    for arch, us in measured.items():
        ours, theirs = us / measured[reference], committed[arch] / committed[reference]
        if abs(ours / theirs - 1) > tolerance:
            off[arch] = (round(ours, 3), round(theirs, 3))
    return off


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the measurements (JSON) here")
    parser.add_argument("--check", action="store_true",
                        help="compare this CPU's costs relative to BERT's with the committed file's (within 25 %%)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    measured = per_op_us(ARCHITECTURES)
    for model_type, us in measured.items():
        print(f"{model_type:12s} {us:6.2f} us per op ({ARCHITECTURES[model_type]})")
    if args.check:
        from memsweep.estimate import host_cost

        off = disagreements(measured, host_cost.per_op_us())
        for arch, (ours, theirs) in off.items():
            print(f"{arch}: {ours} of BERT's here, {theirs} committed")
        print("the committed ratios hold here" if not off else f"{len(off)} ratios differ by more than 25 %")
        sys.exit(1 if off else 0)
    out = {"what": "us per op of a forward and backward at tiny widths, 12 blocks, one sample, one thread",
           "script": "benchmarks/host_per_op.py", "date": datetime.date.today().isoformat(),
           "cpu": cpu_name(), "torch": torch.__version__, "us_per_op": measured}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
