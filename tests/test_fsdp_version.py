"""fsdp.version: 2 (FSDP2, `fully_shard`, the default) or 1 (FSDP1, `FullyShardedDataParallel` with flat
parameters, as accelerate's and Lightning's FSDP1 jobs run it): FSDP1 trains on two CPU processes and is
measured and estimated like any job; its estimate differs from FSDP2's by FSDP1's units (the root keeps the
embeddings, final norm and head, unsharded from its forward to its backward) and its flat parameters (a unit
holding a trained parameter gets a gradient for all of its parameters); a version other than 1 or 2, and
FSDP1 with 4-bit weights, are refused before any work."""
import pytest

from conftest import TINY, job_of, run_job
from surfaces import assert_refused, estimate_cli, refusal, train_py

# A small decoder whose peak is in forward/backward, at a fixed length (as tests/test_distributed.py's)
DECODER = ["task=causal_lm", "model=tiny-llama", "model.hidden_size=256", "model.intermediate_size=704",
           "model.num_layers=4", "model.num_heads=8", "batch_size=4", "max_seq_len=128", "data.train_size=64",
           "data.eval_size=8", "max_steps=3", "logger=none", "threads=1"]
# Smaller still, for estimates alone
SMALL = ["task=causal_lm", "model=tiny-llama", "model.hidden_size=64", "model.intermediate_size=128",
         "model.num_layers=2", "model.num_heads=4", "batch_size=4", "max_seq_len=32", "logger=none", "threads=1",
         "distributed.nproc=2", "fsdp=full_shard"]


@pytest.mark.slow
def test_fsdp1_trains_on_two_cpu_processes_and_its_estimate_follows_rank_0(tmp_path):
    res = run_job(DECODER + ["fsdp=full_shard", "fsdp.version=1", "distributed.nproc=2"], tmp_path / "job")
    assert res["status"] == "ok", res["reason"]
    assert (res["effective"]["world_size"], res["effective"]["backend"]) == (2, "gloo")
    audit = res["effective"]["fsdp"]  # what FSDP1 sharded, read off its units
    assert (audit["version"], audit["world_size"], audit["unit_classes"]) == (1, 2, ["LlamaDecoderLayer",
                                                                                   "LlamaForCausalLM"]), audit
    est, ranks = res["estimate"], res["memory"]["per_rank"]
    assert est["method"] == "trace", est.get("error")
    # each rank steps AdamW on its half of every flat parameter: half the whole model's two moments
    for r in ranks:
        assert r["optimizer_state_bytes"] == pytest.approx(est["total_params"] * 8 / 2, rel=0.001)
    # rank 0 peaks as backward ends, holding the root's gathered parameters and its gradients twice (its views'
    # and the flat one): 303,856,372 B measured, 306,676,516 B estimated (+0.9 %; FSDP2's units: -14.6 %)
    assert est["peak_bytes"] == pytest.approx(ranks[0]["memory"]["peak_bytes"], rel=0.02)
    print(f"\nFSDP1 rank 0: measured {ranks[0]['memory']['peak_bytes']:,} B, estimated {est['peak_bytes']:,} B")


def estimates(extra: list[str]):
    from memsweep.estimate.core import estimate_job

    return [estimate_job(*job_of(SMALL + extra + [f"fsdp.version={v}"])) for v in (1, 2)]


def test_fsdp1s_root_unit_keeps_the_embeddings_unsharded_through_the_step():
    flat, per_param = estimates([])
    embeddings, final_norm = 30522 * 64, 64  # the tokenizer's vocabulary x hidden; RMSNorm's weight
    # FSDP2 as Accelerate wraps it gives the embeddings a unit of their own, resharded after forward; FSDP1's
    # root holds them with the head and the final norm, gathered from its forward until its backward ends
    assert flat.breakdown["params"] - per_param.breakdown["params"] == 4 * (embeddings + final_norm)
    assert flat.optimizer_bytes == per_param.optimizer_bytes  # the same half of AdamW's state
    assert flat.peak_bytes > per_param.peak_bytes


def test_fsdp1s_flat_parameter_gives_a_frozen_weight_in_a_trained_unit_its_gradient():
    frozen, _ = estimates(["freezing=embeddings"])
    trained, _ = estimates([])
    assert frozen.trainable_params < trained.trainable_params
    # the root's FlatParameter requires a gradient for its head: the frozen embeddings get theirs as well
    assert frozen.grads_bytes == trained.grads_bytes
    assert frozen.optimizer_bytes < trained.optimizer_bytes  # the optimizer still steps the trained ones only


@pytest.mark.parametrize("surface", [train_py, estimate_cli])
def test_a_version_other_than_1_or_2_is_one_line_before_any_work(surface, tmp_path, capsys, no_work):
    outcome = refusal(lambda: surface(TINY + ["fsdp=full_shard", "fsdp.version=3"], tmp_path), capsys)
    assert_refused(outcome, "fsdp.version", says="1 or 2")


def test_fsdp1_with_4bit_weights_is_refused_by_a_rule(tmp_path, capsys, no_work):
    outcome = refusal(lambda: train_py(TINY + ["lora=qlora", "fsdp=full_shard", "fsdp.version=1"], tmp_path), capsys)
    assert_refused(outcome, "qlora-with-fsdp1", code=5)
