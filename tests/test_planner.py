"""mode=plan (planner/): the depth shortcut against the full trace, the ranking (the top row is the fastest
that fits), every dropped row refused by a rule or too large, and bad input refused by name."""
import dataclasses

import pytest

from conftest import job_of
from memsweep.config import validate
from memsweep.config.hardware import load_profile
from memsweep.errors import ConfigError
from memsweep.estimate.core import device_key, estimate_job
from memsweep.planner import batch, depth, floor, parallel, search, space, table, twin
from memsweep.planner.space import Combination, Placement

# One worker runs the whole module (`make test`: --dist loadgroup), so its module fixture's jobs run once.
pytestmark = pytest.mark.xdist_group("planner")

# Llama-3's vocabulary: full fine-tuning (its weights, gradients and state: the floor) and micro-batch 8 (its
# logits) do not fit a T4; LoRA at 1 does. Few blocks, so each trace takes seconds.
WIDE = ["task=causal_lm", "model=tiny-llama", "model.hidden_size=4096", "model.intermediate_size=5632",
        "model.vocab_size=128256", "model.num_layers=2", "max_seq_len=1024", "batch_size=8"]


def test_blocks_traced_at_two_depths_and_scaled_match_the_full_trace():
    job, _ = job_of(["task=causal_lm", "model=tiny-llama", "model.num_layers=6", "model.hidden_size=256",
                     "model.intermediate_size=1024", "max_seq_len=256", "batch_size=4", "precision=bf16_true"])
    gpu = load_profile("a100_40gb")
    full = depth.row_figures(job, [gpu], {}, None).per_gpu[gpu.name]
    scaled = depth.row_figures(job, [gpu], {}, [2, 3]).per_gpu[gpu.name]
    assert scaled.peak_bytes == full.peak_bytes  # tensor bytes: affine in the blocks, exactly
    assert scaled.step_s == pytest.approx(full.step_s, rel=1e-6)  # a sum over ops
    # reserved: the larger reserved/allocated ratio of the two traces, on the safe side, and close
    assert full.reserved_bytes <= scaled.reserved_bytes <= 1.1 * full.reserved_bytes


@pytest.mark.parametrize("processes, placement", [(1, Placement(offload="optimizer")),
                                                  (4, Placement(deepspeed="zero2")),
                                                  (4, Placement(deepspeed="zero3_offload")),
                                                  (4, Placement(fsdp="full_shard"))])
def test_blocks_scaled_hold_wherever_the_state_lives(processes, placement):
    """Offloaded, ZeRO-partitioned or FSDP-sharded, each block still adds the same tensors and ops: the depth
    shortcut against the full trace (ZeRO-2's reduce bucket lands a few hundred bytes apart: 1e-5)."""
    job, _ = job_of(["task=causal_lm", "model=tiny-llama", "model.num_layers=5", "model.hidden_size=256",
                     "model.intermediate_size=1024", "max_seq_len=64", "batch_size=64",
                     f"distributed.nproc={processes}"])
    combo = Combination(precision="bf16", optim="adamw", checkpointing="none", lora="none", placement=placement)
    variant, gpu = space.variant(job, combo, 2), load_profile("a100_40gb")
    full = depth.row_figures(variant, [gpu], {}, None).per_gpu[gpu.name]
    scaled = depth.row_figures(variant, [gpu], {}, [2, 3]).per_gpu[gpu.name]
    assert scaled.peak_bytes == pytest.approx(full.peak_bytes, rel=1e-5)
    assert scaled.step_s == pytest.approx(full.step_s, rel=1e-3)
    assert full.reserved_bytes <= scaled.reserved_bytes <= 1.1 * full.reserved_bytes


def test_a_micro_batch_from_two_traces_matches_its_full_trace():
    job, _ = job_of(["task=causal_lm", "model=tiny-llama", "model.num_layers=2", "max_seq_len=64", "batch_size=16"])
    combo = Combination(precision="bf16_true", optim="adamw", checkpointing="none", lora="none")
    variant, gpu, memo = space.variant(job, combo, 8), load_profile("a100_40gb"), {}
    made = depth.row_figures(variant, [gpu], memo, None)
    assert batch.derived(variant, gpu, memo) and "micro-batch from" in made.method  # not traced itself
    own = {}
    traced = estimate_job(variant, gpu, own)
    # each product's shapes on their lines too (a CPU times them at their shapes: roofline.products_s)
    key = device_key(variant, gpu)
    assert memo[key].roofline_products == own[key].roofline_products != []
    scaled, full = made.per_gpu[gpu.name], depth.figures(traced)
    # each allocation on its line, replayed: the same step, to the byte, on the safe side of packing too
    assert (scaled.peak_bytes, scaled.allocated_bytes, scaled.reserved_bytes) == (
        full.peak_bytes, full.allocated_bytes, full.reserved_bytes)
    assert estimate_job(variant, gpu, memo).reserved_upper_bytes == traced.reserved_upper_bytes
    # a row's fit is mode=estimate's own: the safe side of packing plus the context, the same margin
    assert depth.with_fit(full, gpu).margin_bytes == traced.margin_bytes
    assert scaled.step_s == pytest.approx(full.step_s, rel=1e-9)  # each op's FLOPs and bytes on its line


def test_over_several_processes_a_micro_batch_is_derived_from_the_same_processes_traces():
    job, _ = job_of(["task=causal_lm", "model=tiny-llama", "model.num_layers=2", "max_seq_len=64", "batch_size=64",
                     "distributed.nproc=4"])
    combo = Combination(precision="bf16_true", optim="adamw", checkpointing="none", lora="none")
    variant, gpu, memo = space.variant(job, combo, 8), load_profile("a100_40gb"), {}  # 8 a rank, accumulation 2
    made = depth.row_figures(variant, [gpu], memo, None)
    assert batch.derived(variant, gpu, memo)
    bases = [batch.at_micro_batch(variant, k) for k in batch.BASES]  # each rank's 16 as 2 x 8 and 4 x 4
    assert [b.accumulation.steps for b in bases] == [8, 4]
    full, scaled = depth.figures(estimate_job(variant, gpu, {}), 4), made.per_gpu[gpu.name]
    assert (scaled.peak_bytes, scaled.allocated_bytes, scaled.reserved_bytes) == (
        full.peak_bytes, full.allocated_bytes, full.reserved_bytes)
    assert scaled.step_s == pytest.approx(full.step_s, rel=1e-9)


def test_a_rows_total_is_what_the_estimate_fits_paged_state_and_images_included():
    t4 = load_profile("t4")
    # bitsandbytes' paged state is outside reserved and on the GPU: the row's total counts it as the estimate does
    paged, _ = job_of(["task=causal_lm", "model=tiny-llama", "model.num_layers=2", "max_seq_len=64", "batch_size=4",
                       "optim=paged_adamw_8bit"])
    row = depth.row_figures(paged, [t4], {}, None).per_gpu[t4.name]
    est = estimate_job(paged, t4, {})
    assert row.paged_bytes == est.trace["paged_state_bytes"] > 0
    assert row.total_bytes == est.device_used_upper_bytes
    # an image counts no tokens: no tokens_per_s, shown empty
    image, _ = job_of(["task=image_classification", "model=tiny-vit", "batch_size=4"])
    row = depth.row_figures(image, [t4], {}, None).per_gpu[t4.name]
    assert row.step_s and row.tokens is None and row.tokens_per_s is None


def test_fp16_from_the_bf16_trace_is_within_the_tolerance_of_its_own():
    job, _ = job_of(["task=causal_lm", "model=tiny-llama", "model.num_layers=2", "max_seq_len=64", "batch_size=4"])
    combo = Combination(precision="bf16", optim="adamw", checkpointing="none", lora="r8")
    t4, memo = load_profile("t4"), {}  # a T4 has no bf16 rate: the ops must be read as fp16's
    fp16 = space.variant(job, dataclasses.replace(combo, precision="fp16"), 2)
    estimate_job(space.variant(job, combo, 2), t4, memo)
    made = depth.row_figures(fp16, [t4], memo, None)
    assert "the bf16 trace" in made.method
    own = {}
    scaled, full = made.per_gpu[t4.name], depth.figures(estimate_job(fp16, t4, own))
    # the products read in fp16 as they are traced in fp16
    assert memo[device_key(fp16, t4)].roofline_products == own[device_key(fp16, t4)].roofline_products != []
    assert (scaled.peak_bytes, scaled.allocated_bytes, scaled.reserved_bytes, scaled.step_s) == pytest.approx(
        (full.peak_bytes, full.allocated_bytes, full.reserved_bytes, full.step_s), rel=twin.TOLERANCE)


def test_two_worker_processes_find_the_rows_one_finds():
    job, _ = job_of(["task=causal_lm", "model=tiny-llama", "model.num_layers=2", "max_seq_len=64", "batch_size=4",
                     "plan.hardware=[t4,a100_40gb]", "plan.precision=[fp16,bf16_true,bf16]", "plan.lora=[none,r8]",
                     "plan.optim=[adamw]", "plan.checkpointing=[none]", "plan.micro_batches=[2]", "plan.workers=2",
                     "plan.offload=[none]"])
    units = space.units(job)
    # a combination and its precision twin in one unit (the one's trace serves the other); LoRA's first
    assert [[c.precision for _, c in u] for u in units] == [["fp16", "bf16"], ["bf16_true"]] * 2
    assert [[c.lora for _, c in u] for u in units] == [["r8", "r8"], ["r8"], ["none", "none"], ["none"]]
    assert sorted(n for u in units for n, _ in u) == list(range(1, 7))
    lines = []
    there = search.search(job, progress=lines.append)
    # the same units one after another in one fresh process, sharing one memo, as a search with one worker does
    # here (a fresh process: this one holds what earlier tests left behind)
    [here] = parallel.map_units(search.unit_rows, job, [[c for u in units for c in u]], 1, lambda line: None)
    differ = [(n, a, b) for n, (a, b) in enumerate(zip(there, here)) if a != b]
    assert len(lines) == 6 and len(there) == len(here) and not differ, differ[:2]
    assert any(r.status == "fits" for r in here)


@pytest.mark.fast
def test_worker_count_is_asked_for_or_one_per_cpu_never_more_than_units():
    assert parallel.workers(0, 100) == parallel.cpus() >= 1
    assert (parallel.workers(3, 2), parallel.workers(1, 5), parallel.workers(0, 1)) == (2, 1, 1)


@pytest.fixture(scope="module")
def plan_rows():
    # bf16 is refused on a T4 by a rule, before any trace
    job, _ = job_of(WIDE + ["plan.hardware=[t4]", "plan.precision=[bf16_true,fp16]", "plan.lora=[none,r8]",
                            "plan.optim=[adamw]", "plan.checkpointing=[none]", "plan.micro_batches=[1,8]",
                            "plan.offload=[none]"])
    space.check_plan_keys(job)
    memo = {}
    return job, table.ranked(search.search(job, memo=memo)), memo


def test_the_top_row_is_the_fastest_that_fits_and_every_dropped_row_is_refused_or_too_large(plan_rows):
    job, rows, memo = plan_rows
    fitting = [r for r in rows if r.status == "fits"]
    assert fitting and rows[0].rank == 1 and rows[0].status == "fits"
    assert rows[0].figures.step_s == min(r.figures.step_s for r in fitting)
    dropped = [r for r in rows if r.status != "fits"]
    assert {r.status for r in dropped} == {"refused", "does not fit"}
    for row in dropped:
        variant, profile = space.variant(job, row.combination, row.micro_batch), load_profile(row.gpu)
        if row.status == "refused":
            assert search.refusals(variant, [profile]) == {profile.name: row.reason}
        else:  # traced in the plan (the memo holds that full trace), by the floor or not at all: the full
            assert not estimate_job(variant, profile, memo).fits  # estimate of that job does not fit
    assert any(r.method == search.FLOOR for r in dropped)  # the floor's rows were checked too


def test_the_floor_is_under_the_full_trace(plan_rows):
    """What the floor counts is held at the step: never more than the traced step's allocated peak."""
    job, rows, memo = plan_rows
    row = next(r for r in rows if r.status == "fits")
    variant, profile = space.variant(job, row.combination, row.micro_batch), load_profile(row.gpu)
    held = floor.held_bytes(variant, profile)
    assert held.grads > 0 and held.optimizer > 0
    assert sum(held.parts().values()) <= row.figures.allocated_bytes


def test_plan_writes_its_tables(plan_rows, tmp_path):
    _, rows, _ = plan_rows
    text = table.write(rows, tmp_path, top=1, title="t", written=table.Written({}))
    assert (tmp_path / "plan.csv").read_text().count("\n") == len(rows) + 1
    assert "### t4:" in text and "first 1 shown" in text


@pytest.mark.parametrize("override, key", [("plan.hardware=[nosuch]", "plan.hardware"),
                                           ("plan.lora=[r9]", "plan.lora"),
                                           ("plan.micro_batches=[3]", "plan.micro_batches"),
                                           ("plan.deepspeed=[zero4]", "plan.deepspeed"),
                                           ("plan.offload=[gpu]", "plan.offload"),
                                           ("plan.workers=-1", "plan.workers"),
                                           ("plan.hardware=[]", "plan.hardware"),
                                           ("plan.depths=[2,2]", "plan.depths"),
                                           ("plan.optim=[adamw,adamw]", "plan.optim")])
def test_bad_plan_input_is_refused_naming_the_key(override, key):
    job, _ = job_of(WIDE + [override])
    with pytest.raises(ConfigError, match=key):
        validate.ranges(job)  # what schema.py declares (constraints.py)
        space.check_plan_keys(job)  # what the lists name


def test_a_row_that_is_not_a_valid_job_is_refused_before_a_trace(monkeypatch):
    """Each generated row is checked as the job it would be: one the command line would refuse is a refused row
    naming the key, never traced (here an option file's learning rate made negative)."""
    job, _ = job_of(WIDE + ["plan.hardware=[t4]"])
    made = space.variant(job, Combination(precision="bf16", optim="adamw", checkpointing="none", lora="r8"), 1)
    broken = dataclasses.replace(made, optim=dataclasses.replace(made.optim, lr=-1.0))
    monkeypatch.setattr(space, "variant", lambda *args: broken)
    monkeypatch.setattr(depth, "row_figures", lambda *args: pytest.fail("a refused row was traced"))
    rows = search.rows_of(Combination(precision="bf16", optim="adamw", checkpointing="none", lora="r8"), 1, job,
                          [load_profile("t4")], {}, None)
    assert [(r.status, r.reason.split(" is ")[0]) for r in rows] == [("refused", "bad input: optim.lr: -1.0")]


@pytest.mark.parametrize("network", [None, 50])
def test_a_row_whose_time_leaves_out_collectives_across_nodes_says_so(network):
    job, _ = job_of(["task=causal_lm", "model=tiny-llama", "max_seq_len=64", "batch_size=8", "distributed.nproc=2",
                     "distributed.nodes=2", "plan.hardware=[a100_40gb]", "plan.precision=[bf16]", "plan.lora=[none]",
                     "plan.optim=[adamw]", "plan.checkpointing=[none]", "plan.micro_batches=[2]",
                     "plan.deepspeed=[none]", "plan.fsdp=[none,full_shard]"]
                    + ([f"distributed.network_gbs={network}"] if network else []))
    rows = [r for r in search.search(job, memo={}) if r.status in ("fits", "does not fit")]
    assert rows and all(r.figures.step_s for r in rows)
    if network:
        assert not any("not timed" in r.reason for r in rows)
    else:  # a lower bound, and the row says why
        assert all("collectives of 4 processes are not timed" in r.reason for r in rows)


@pytest.mark.fast
def test_a_combination_is_the_job_it_would_be():
    job, _ = job_of(WIDE)
    combo = Combination(precision="fp16", optim="adafactor", checkpointing="full", lora="qlora")
    variant = space.variant(job, combo, 2)
    assert (variant.precision.name, variant.optim.name, variant.lora.name, variant.accumulation.steps) == (
        "fp16", "adafactor", "qlora", 4)
    assert dataclasses.replace(variant, precision=job.precision, optim=job.optim, checkpointing=job.checkpointing,
                               lora=job.lora, accumulation=job.accumulation) == job
    # over several processes each takes its share of the batch: micro-batch x accumulation x processes
    ranks, _ = job_of(WIDE + ["distributed.nproc=2", "distributed.nodes=2"])
    assert space.micro_batches(ranks) == [1, 2]
    assert space.variant(ranks, Combination(precision="fp16", optim="adamw", checkpointing="none", lora="r8"),
                         1).accumulation.steps * 1 * 4 == ranks.batch_size


def test_where_the_state_lives_is_searched_as_the_process_count_allows():
    one, _ = job_of(WIDE)
    assert [p.offload for p in space.placements(one, "none")] == ["none", "optimizer"]
    assert [p.offload for p in space.placements(one, "r8")] == ["none"]  # LoRA: plan.lora_offload
    ranks, _ = job_of(WIDE + ["distributed.nproc=4"])  # DDP, then each deepspeed and fsdp option that is on
    assert [p.overrides for p in space.placements(ranks, "none")] == [
        "none", "deepspeed=zero2", "deepspeed=zero3", "deepspeed=zero3_offload", "fsdp=full_shard",
        "fsdp=full_shard_offload"]
    combo = Combination(precision="bf16", optim="adamw", checkpointing="none", lora="none",
                        placement=Placement(deepspeed="zero3_offload"))
    variant = space.variant(ranks, combo, 1)
    assert (variant.deepspeed.stage, variant.deepspeed.offload_param, variant.fsdp.name) == (3, True, "none")
    assert "DeepSpeed zero3_offload" in combo.changes
    assert len(list(space.combinations(ranks))) == 3 * 3 * 2 * 6 + 3 * 2 * 3 * 6  # full x optim + LoRA-family


def test_optimizer_offload_lowers_the_floor_to_what_stays_on_the_gpu():
    """fp32 full fine-tuning of WIDE: weights, gradients and AdamW's state do not fit a T4, so the row is
    refused by the floor without a trace; with the state on the host what is left is traced, and fits."""
    job, _ = job_of(WIDE + ["plan.hardware=[t4]", "plan.precision=[fp32]", "plan.lora=[none]", "plan.optim=[adamw]",
                            "plan.checkpointing=[none]", "plan.micro_batches=[1]", "plan.offload=[none,optimizer]"])
    rows = {r.combination.placement.offload: r for r in search.search(job, memo={}) if r.micro_batch == 1}
    assert rows["none"].method == search.FLOOR and rows["none"].status == "does not fit"
    assert "optimizer" in rows["none"].reason
    assert rows["optimizer"].method == "trace" and rows["optimizer"].status == "fits"
    held = floor.held_bytes(space.variant(job, rows["none"].combination, 1), load_profile("t4"))
    kept = floor.on_device(held, Placement(offload="optimizer")).parts()
    assert set(kept) == {"weights", "grads"} and sum(kept.values()) <= rows["optimizer"].figures.allocated_bytes
    assert floor.on_device(held, Placement(offload="optimizer_and_grads")).parts() == {"weights": held.weights}


@pytest.fixture(scope="module")
def sharded_rows():
    job, _ = job_of(["task=causal_lm", "model=tiny-llama", "model.num_layers=2", "model.hidden_size=512",
                     "model.intermediate_size=1408", "max_seq_len=64", "batch_size=8", "distributed.nproc=4",
                     "plan.hardware=[a100_40gb]", "plan.precision=[bf16,bf16_true]", "plan.lora=[none]",
                     "plan.optim=[adamw]", "plan.checkpointing=[none]", "plan.micro_batches=[2]"])
    space.check_plan_keys(job)
    return job, table.ranked(search.search(job, memo={}))


def test_several_processes_search_ddp_zero_and_fsdp_each_row_its_job(sharded_rows):
    job, rows = sharded_rows
    assert {r.combination.placement for r in rows} == set(space.placements(job, "none"))
    for row in rows:
        variant, gpu = space.variant(job, row.combination, row.micro_batch), load_profile(row.gpu)
        if row.status == "refused":  # DeepSpeed keeps its own fp32 master: no bf16_true
            assert search.refusals(variant, [gpu]) == {gpu.name: row.reason}
            continue
        est = estimate_job(variant, gpu, {})
        assert row.accumulation == 1 and row.figures.tokens == 8 * 64  # the batch over 4 processes
        assert (row.figures.allocated_bytes, row.figures.fits) == (est.peak_allocated_bytes, est.fits)
    ddp, sharded = (next(r for r in rows if r.combination.precision == "bf16" and r.combination.placement == p)
                    for p in (Placement(), Placement(fsdp="full_shard")))
    assert sharded.figures.allocated_bytes < ddp.figures.allocated_bytes  # each rank holds a quarter of the state


def test_a_time_that_is_a_lower_bound_ranks_after_those_timed_whole(sharded_rows):
    _, rows = sharded_rows
    fitting = [r for r in rows if r.status == "fits"]
    whole, bound = ([r for r in fitting if bool(r.figures.time_note) is b] for b in (False, True))
    assert whole and bound and fitting == whole + bound  # every lower bound after every whole time
    assert [r.figures.step_s for r in whole] == sorted(r.figures.step_s for r in whole)
    shown = table.markdown(rows)
    assert f">= {round(bound[0].figures.step_s, 4)}" in shown and f"| {round(whole[0].figures.step_s, 4)} |" in shown


@pytest.mark.fast
def test_a_small_plan_through_the_job_ranks_its_rows_and_writes_them(tmp_path):
    """mode=plan as train.py runs it (app/plan.py), in this process: a rule refuses bf16 on the T4 before any
    trace, the fitting rows are ranked by predicted step time, and results.json names the top one."""
    import csv

    from conftest import run_job

    res = run_job(["mode=plan", "task=causal_lm", "model=tiny-llama", "model.num_layers=2", "max_seq_len=64",
                   "batch_size=4", "logger=none", "plan.hardware=[t4]", "plan.precision=[fp16,bf16]",
                   "plan.lora=[none,r8]", "plan.optim=[adamw]", "plan.checkpointing=[none]", "plan.offload=[none]",
                   "plan.micro_batches=[4]", "plan.depths=[]", "plan.workers=1"], tmp_path)
    assert res["status"] == "ok", res["reason"]
    with open(tmp_path / "plan.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert res["effective"]["plan"]["rows"] == len(rows) == 4 and (tmp_path / "plan.md").is_file()
    assert {r["status"] for r in rows if r["precision"] == "bf16"} == {"refused"}
    fitting = [r for r in rows if r["status"] == "fits"]
    assert [int(r["rank"]) for r in fitting] == list(range(1, len(fitting) + 1)) and fitting
    assert [float(r["step_s"]) for r in fitting] == sorted(float(r["step_s"]) for r in fitting)
    top = res["effective"]["plan"]["fastest"]["t4"]
    assert (top["precision"], top["lora"], top["micro_batch"]) == (fitting[0]["precision"], fitting[0]["lora"], 4)


def test_a_worker_that_cannot_start_fails_the_plan_instead_of_hanging(monkeypatch):
    """A pool replaces a worker whose initializer raises, forever: the error is kept and ends its first unit."""
    from memsweep.run import console

    def broken(log):
        raise OSError("no such log")

    monkeypatch.setattr(console, "worker_output_to", broken)
    monkeypatch.setattr(parallel, "_broken", [])
    parallel._start(None)  # as a spawned worker would: it does not raise
    with pytest.raises(RuntimeError, match="a plan worker could not start: OSError: no such log"):
        parallel._run((0, None, None, None))
