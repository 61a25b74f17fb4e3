"""The two install paths pin the same versions, and torch is pinned (an unpinned one may pull a CUDA build)."""
import re
import tomllib

import yaml

from conftest import ROOT


def _pins(lines):
    return dict(re.match(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)$", x.strip()).groups() for x in lines)


def test_environment_yml_and_pyproject_pin_the_same_versions():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pyproject = _pins(project["dependencies"] + project["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert _pins(pip) == pyproject
    assert "python=3.11" in env["dependencies"]


def test_torch_is_pinned_in_every_install_path():
    assert "torch==2.13.0" in (ROOT / "Makefile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.13.0" in project["dependencies"]
