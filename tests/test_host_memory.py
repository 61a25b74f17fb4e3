"""malloc_reuse: freed host memory is reused by the next step instead of being mapped and faulted in anew."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

# One small layer under MiniLM's 47 MB word embeddings: its gradient is made and freed every step,
# above the largest block glibc's adaptive threshold keeps off mmap (32 MiB).
BIG_EMBEDDING = ["model=tiny", "model.hidden_size=384", "model.num_heads=6", "model.intermediate_size=384",
                 "model.num_layers=1", "data.train_size=512", "data.eval_size=64", "max_steps=10",
                 "logger=none", "measure.estimate=false", "threads=1"]


def default_then_reused(tmp_path) -> tuple[dict, dict]:
    """One sweep process, the job without reuse first: the setting cannot be undone inside a process, so
    the first job runs as glibc does by default and the second with reuse."""
    sweep_dir = tmp_path / "sweep"
    subprocess.run([sys.executable, "train.py", "-m", *BIG_EMBEDDING, "malloc_reuse=false,true",
                    f"hydra.sweep.dir={sweep_dir}"], cwd=ROOT, check=True, capture_output=True)
    return tuple(json.loads((sweep_dir / str(i) / "results.json").read_text()) for i in range(2))


@pytest.mark.slow  # two jobs in a sweep process
def test_reuse_stops_faulting_in_each_step_anew(tmp_path):
    embedding_pages = 30522 * 384 * 4 // 4096
    default, reused = default_then_reused(tmp_path)
    assert (default["effective"]["malloc_reuse"], reused["effective"]["malloc_reuse"]) == (False, True)
    # glibc maps the embedding gradient afresh every step: every one of its pages faults again
    assert default["time"]["minor_faults_per_step"] > 0.9 * embedding_pages
    assert reused["time"]["minor_faults_per_step"] < default["time"]["minor_faults_per_step"] / 4


def test_a_later_job_is_told_what_the_process_runs_with(tiny_job, tmp_path):
    assert tiny_job("max_steps=4")["effective"]["malloc_reuse"] is True
    # It cannot be undone in a process: a later job that asks for false still runs with it, and says so.
    later = tiny_job("max_steps=4", "malloc_reuse=false", job_dir=tmp_path / "later")
    assert later["effective"]["malloc_reuse"] is True


# In a fresh process with reuse on: blocks of 16 to 128 MiB, each freed before the next is made.
BLOCKS_MADE_AND_FREED = """
import sys, torch
from memsweep.measure import memcap
from memsweep.measure import host_memory
MiB = 2**20
def make_and_free():
    for n in range(1, 9):
        torch.empty(n * 16 * MiB, dtype=torch.uint8).fill_(1)
assert host_memory.keep_freed_memory()
start = memcap.address_space_bytes()
if sys.argv[1] == "capped":
    with memcap.cap(160 * MiB):
        assert not host_memory.in_effect()
        make_and_free()
    assert host_memory.in_effect()
else:
    make_and_free()
print((memcap.address_space_bytes() - start) // MiB)
"""


@pytest.mark.parametrize("mode", ["free", "capped"])
def test_a_capped_address_space_follows_the_live_blocks(mode):
    done = subprocess.run([sys.executable, "-c", BLOCKS_MADE_AND_FREED, mode], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    grown_mib = int(done.stdout.split()[-1])
    if mode == "free":  # reuse: the heap keeps what it grew to, about the largest block (128 MiB)
        assert grown_mib >= 96
    else:  # under the cap each block is mapped on its own and handed back when freed
        assert grown_mib < 16


def test_onednn_failing_to_make_a_primitive_under_the_cap_is_running_out_of_memory():
    # ideep gives every failed primitive creation one message; under the cap it is oneDNN's mapping that failed
    from memsweep import errors
    from memsweep.measure import memcap

    with pytest.raises(MemoryError, match="could not create a primitive") as raised:
        with memcap.cap(2**30):
            raise RuntimeError("could not create a primitive")
    assert errors.is_oom(raised.value)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):  # any other error stays what it is
        with memcap.cap(2**30):
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
