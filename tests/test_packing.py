"""Reserved bytes on the safe side of packing (capture.packing_envelope): the caching allocator's reserved
bytes hinge on whether blocks freed earlier fit later requests, so the replay of one step is not smooth
in the step's size. The upper figure, which `fits`, the margin and autofit use, is never below the
replay's own and never falls as the micro-batch or the sequence length grow."""
import pytest

from memsweep.estimate import capture
from memsweep.estimate.allocator import replay
from memsweep.estimate.allocator_conf import MIB, Options
from memsweep.estimate.events import Event

LAYERS = 4


def synthetic_step(tokens: int) -> tuple[list[Event], dict]:
    """A decoder-like step: weights, workspace and optimizer state alive throughout; per layer a forward
    that keeps an input and a wide intermediate for backward and frees a scratch block; a backward that
    frees them in reverse and makes each layer's gradient."""
    events, categories = [], {}

    def alloc(key, nbytes, category):
        events.append(Event.alloc(key, nbytes))
        categories[key] = category

    for layer in range(LAYERS):
        alloc(("w", layer), 24 * MIB, "params")
        alloc(("m", layer), 24 * MIB, "optimizer")
    alloc("workspace", capture.cublas_workspace_bytes(), "workspace")
    for layer in range(LAYERS):
        alloc(("x", layer), tokens * 4096, "activations")
        alloc(("h", layer), tokens * 16384, "activations")
        alloc(("scratch", layer), tokens * 12288, "activations")
        events.append(Event.free(("scratch", layer)))
    for layer in reversed(range(LAYERS)):
        alloc(("g", layer), 24 * MIB, "grads")
        alloc(("dh", layer), tokens * 16384, "activations")
        events += [Event.free(("dh", layer)), Event.free(("h", layer)), Event.free(("x", layer))]
    return events, categories


def upper(events, categories) -> int:
    return capture.allocator_reading(events, categories, conf="").reserved_upper_bytes


def test_the_upper_figure_is_never_below_the_replay():
    for tokens in range(256, 4096, 96):
        events, categories = synthetic_step(tokens)
        assert upper(events, categories) >= replay(events, Options()).peak_reserved_bytes


def test_the_upper_figure_never_falls_as_the_step_grows():
    sizes = range(256, 4096, 32)
    figures = [upper(*synthetic_step(tokens)) for tokens in sizes]
    falls = [(a, b) for (a, fa), (b, fb) in zip(zip(sizes, figures), zip(sizes[1:], figures[1:])) if fb < fa]
    assert not falls


def test_the_envelope_alone_never_falls_where_activations_grow_in_proportion():
    # every step here scales to the same steps on the fixed rungs: a larger one replays those of a smaller
    # one and more above them, while the one-step replay itself falls and rises with the packing
    sizes = range(256, 4096, 16)
    envelope = [capture.packing_envelope(*synthetic_step(tokens), Options()) for tokens in sizes]
    assert all(b >= a for a, b in zip(envelope, envelope[1:]))
    point = [replay(synthetic_step(tokens)[0], Options()).peak_reserved_bytes for tokens in sizes]
    assert any(b < a for a, b in zip(point, point[1:]))


def test_without_categories_the_upper_figure_is_the_replay():
    events, _ = synthetic_step(1024)
    reading = capture.allocator_reading(events, conf="")
    assert reading.reserved_upper_bytes == reading.peak_reserved_bytes


@pytest.mark.slow  # twelve traces of a tiny Llama on a GPU profile
def test_the_estimates_upper_reserved_never_falls_over_a_grid():
    from omegaconf import OmegaConf

    from conftest import compose_config
    from memsweep.config import hardware
    from memsweep.estimate import core

    micros, lengths, grid = (1, 2, 4), (32, 64, 96, 128), {}
    for micro in micros:
        for seq in lengths:
            job = OmegaConf.to_object(compose_config(["task=causal_lm", "model=tiny-llama", "optim=adamw",
                                                      f"batch_size={micro}", f"max_seq_len={seq}",
                                                      "hardware=a100_40gb"]))
            est = core.estimate_job(job, hardware.detect(job.hardware))
            assert est.total_bytes == est.device_used_upper_bytes >= est.device_used_bytes
            grid[micro, seq] = est.reserved_upper_bytes
    for micro in micros:
        assert [grid[micro, seq] for seq in lengths] == sorted(grid[micro, seq] for seq in lengths), micro
    for seq in lengths:
        assert [grid[micro, seq] for micro in micros] == sorted(grid[micro, seq] for micro in micros), seq


def test_the_estimate_says_its_upper_figure_holds_for_steps_at_max_seq_len():
    from conftest import job_of
    from memsweep.estimate.core import estimate_job

    def says(*overrides: str) -> bool:
        notes = estimate_job(*job_of(["model=tiny", "max_seq_len=128", *overrides])).notes
        return any(n.startswith("reserved upper: for steps at max_seq_len") for n in notes)

    assert says("hardware=h200")  # each batch padded to its longest: shorter steps come too
    assert not says("hardware=h200", "data.pad_to_multiple_of=128")  # every step the traced one
    assert not says()  # a CPU reserves nothing
