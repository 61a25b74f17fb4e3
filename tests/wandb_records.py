"""Read a W&B offline run file (`run-*.wandb`) back: a LevelDB-style log of protobuf `Record`s.

wandb 0.31 has no Python reader any more (it moved into wandb-core), so the tests carry this one.
Layout: a 7-byte file header (":W&B", magic, version), then 32 KiB blocks of chunks, each with a
7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last).
"""
import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = 7


def records(path: Path):
    raw = Path(path).read_bytes()
    assert raw[:4] == b":W&B", "not a W&B run file"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(raw):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:  # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + HEADER])
        chunk = raw[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        if kind in (1, 2):
            pending = chunk
        else:
            pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def run_contents(path: Path) -> dict:
    """{'run': RunRecord, 'config': {key: value}, 'summary': {key: value}, 'history': [...]}"""
    out = {"run": None, "config": {}, "summary": {}, "history": []}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            for item in record.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "summary":
            for item in record.summary.update:
                key = item.key or "/".join(item.nested_key)
                out["summary"][key] = json.loads(item.value_json)
        elif kind == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                   for i in record.history.item})
    return out


def find_run_file(job_dir: Path) -> Path:
    files = sorted(Path(job_dir).glob("wandb/offline-run-*/run-*.wandb"))
    assert files, f"no offline W&B run under {job_dir}"
    return files[-1]


def wait_for_run(path: Path, timeout_s: float = 15.0) -> dict:
    """run_contents once the run record is on disk: wandb-core writes the file from its own process,
    and `finish()` returning has been seen to precede the record by a moment."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        contents = run_contents(path)
        if contents["run"] is not None or time.monotonic() > deadline:
            return contents
        time.sleep(0.2)
