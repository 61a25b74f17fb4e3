"""The surfaces a person types bad input on, run in this process as their commands run them: train.py
(the command line checked, then the job), the estimate CLI, and the start of a search. Each returns the
exit code; the caller reads what was printed (capsys) and checks it is one clean line."""
import re
import sys
import time
from pathlib import Path

import pytest

from conftest import CONF, compose_config, run_job
from memsweep.errors import ConfigError

ERROR = re.compile(r"^memsweep: error: ([\w.]+): ")


def train_py(args: list[str], job_dir: Path) -> int:
    """`python train.py <args>` for a single job: its __main__ (the command line), then the job."""
    from memsweep.config.validate_args import arguments

    try:
        arguments(args)
    except ConfigError as exc:
        print(f"memsweep: error: {exc}", file=sys.stderr)
        return 2
    try:
        run_job(args, job_dir, exits=True)
    except SystemExit as stop:
        return stop.code
    return 0


def estimate_cli(args: list[str], out: Path) -> int:
    """`python -m memsweep.app.estimate <args>`."""
    from memsweep.app.estimate import main

    return main(args + ["--out", str(out)])


def search_start(args: list[str]) -> int:
    """`python train.py -m hparams_search=optuna <args>` up to its first trial: the command line, then the
    sweep's start (callbacks.SweepReport), where a search that cannot run is refused."""
    from hydra import compose, initialize_config_dir

    from memsweep.app.callbacks import SweepReport
    from memsweep.config.validate_args import arguments
    from memsweep.sweep.search import register_resolver

    register_resolver()
    try:
        arguments(args)
    except ConfigError as exc:
        print(f"memsweep: error: {exc}", file=sys.stderr)
        return 2
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[a for a in args if a != "-m"], return_hydra_config=True)
    with pytest.raises(SystemExit) as stop:  # a search that is not refused would go on to its trials
        SweepReport().on_multirun_start(cfg)
    return stop.value.code


def refusal(run, capsys) -> tuple[int, list[str], str, float]:
    """Run a surface; (exit code, its `memsweep: error:` lines, everything printed, seconds)."""
    started = time.process_time()  # CPU seconds: a busy machine's waiting is not the check's cost
    code = run()
    took = time.process_time() - started
    out, err = capsys.readouterr()
    return code, [line for line in (out + err).splitlines() if ERROR.match(line)], out + err, took


def assert_refused(outcome, key: str, says: str = "", code: int = 2) -> None:
    """Exit code 2 (or 5: a rule's `unsupported`), exactly one line naming the key, no traceback, in < 5 s."""
    got, errors, printed, took = outcome
    assert got == code, printed[-2000:]
    if code == 2:
        assert len(errors) == 1 and ERROR.match(errors[0]).group(1) == key, errors or printed[-2000:]
        assert says in errors[0], errors[0]
    else:
        assert f"unsupported ({key}" in printed, printed[-2000:]
    assert "Traceback" not in printed and took < 5, took


__all__ = ["train_py", "estimate_cli", "search_start", "refusal", "assert_refused", "compose_config"]
