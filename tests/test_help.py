"""`python train.py --help` is memsweep's own help (conf/hydra/help/memsweep.yaml through Hydra's help template):
what memsweep is, every config group with its options, the modes, and example commands that memsweep's own
command-line checks accept.
"""
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT
from memsweep.config.choices import Mode
from memsweep.config.schema import CONF_DIR
from memsweep.config.validate_args import arguments


@pytest.fixture(scope="module")
def help_text() -> str:
    proc = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.stdout


def _groups() -> list[str]:
    return sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")


def _section(text: str, title: str) -> str:
    """The lines from a `== <title> ...` heading to the next heading."""
    start = text.index(f"== {title}")
    end = text.find("\n== ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_help_is_memsweeps_and_not_hydras_default(help_text):
    assert help_text.startswith("memsweep: ")
    assert "is powered by Hydra" not in help_text  # Hydra's default header


def test_help_lists_every_group_with_every_option(help_text):
    for group in _groups():
        options = ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
        assert f"\n{group}: {options}\n" in help_text, group


def test_help_sorts_every_group_into_a_kind(help_text):
    """The sentence before the list names each group once: a group added to conf/ must be placed there too."""
    groups_section = _section(help_text, "Config groups")
    kinds = groups_section.split("\n\n")[0]
    for group in _groups():
        assert len(re.findall(rf"\b{group}\b", kinds)) == 1, group


def test_help_names_every_mode(help_text):
    modes = _section(help_text, "Modes")
    for mode in Mode:
        assert re.search(rf"^\s+{mode.value}\s+\S", modes, re.MULTILINE), mode.value


def test_help_examples_are_a_job_a_sweep_an_estimate_and_a_plan_that_the_checks_accept(help_text):
    block = help_text[help_text.index("\nExamples:\n"):].split("\n\n")[0]
    argvs = [shlex.split(re.split(r"\s{2,}", line.strip())[0])[2:] for line in block.splitlines()
             if line.strip().startswith("python train.py ")]
    modes = [next((x for x in argv if x.startswith("mode=")), "mode=train") for argv in argvs]
    assert ("-m" not in argvs[0], modes[0]) == (True, "mode=train")  # a single job
    assert any("-m" in argv and mode == "mode=train" for argv, mode in zip(argvs, modes))  # a sweep
    assert {"mode=estimate", "mode=plan"} <= set(modes)
    for argv in argvs:
        arguments(argv)  # memsweep's command-line checks: a stale example raises ConfigError
