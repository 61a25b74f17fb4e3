"""The package's shape: sub-packages in layers whose imports point one way (import-linter's contracts in
pyproject.toml, checked here as well by their effect), no import cycle between modules (lazy imports inside
functions count too), and no module or function past the length where reading it top to bottom fails."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "memsweep"
# Ceilings, not targets: modules aim at about 300 lines and functions at about 50, shaped by meaning; past these
# a module holds two concerns, or a function a concept that has no name yet.
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = ["memsweep", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """memsweep modules that `name` imports anywhere in its file (a submodule's package included:
    importing it runs the package's __init__ first)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target:
                if target in known and target != name:
                    found.add(target)
                target = target.rpartition(".")[0]
    # a module's own packages are initialised before it runs: importing a sibling adds no edge to them
    ancestors = {name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)}
    return found - ancestors - {"memsweep"}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_relative_imports_resolve_to_modules(tmp_path):
    known = set(modules())
    assert "memsweep.estimate.core" in imports_of("memsweep.app.job", PACKAGE / "app" / "job.py", known)
    assert "memsweep.estimate.table" in imports_of("memsweep.sweep.estimates", PACKAGE / "sweep" / "estimates.py",
                                                   known)


def test_no_import_cycle():
    found = modules()
    graph = {name: imports_of(name, path, set(found)) for name, path in found.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_is_too_long_to_read():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


MAX_FUNCTION_LINES = 70


def test_no_function_is_too_long_to_read():
    # a function reads as a recipe; a longer one is a sign that a concept has no name yet
    long = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{name}.{node.name}"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_package_is_laid_out_in_sub_packages():
    # the architecture shows in the tree: one sub-package per concern, a few shared modules at the top
    top = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert top <= {"errors", "resume"}, top
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} == set(LAYERS) - {"errors"}


# Top to bottom, as pyproject.toml's layers contract says it: a sub-package imports only those after it.
LAYERS = ["app", "sweep", "planner", "estimate", "run", "measure", "techniques", "config", "errors"]
SIBLINGS = {frozenset({"sweep", "planner"})}  # one layer: neither imports the other


def sub_package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


@pytest.mark.fast
def test_every_import_between_sub_packages_points_down():
    found = modules()
    upward = set()
    for name, path in found.items():
        own = sub_package(name)
        for target in imports_of(name, path, set(found)):
            other = sub_package(target)
            if own in LAYERS and other in LAYERS and own != other and (
                    LAYERS.index(other) < LAYERS.index(own) or frozenset({own, other}) in SIBLINGS):
                upward.add(f"{name} -> {target}")
    assert not upward, "imports that point up or sideways: " + ", ".join(sorted(upward))


def test_the_layers_contract_fails_the_build_on_an_upward_import(tmp_path):
    # a copy of the package with one import pointing up (config -> run): lint-imports refuses it in its own words
    shutil.copytree(PACKAGE, tmp_path / "src" / "memsweep", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    schema = tmp_path / "src" / "memsweep" / "config" / "choices.py"
    schema.write_text(schema.read_text() + "\n\ndef _up():\n    from ..run import results  # noqa: F401\n")
    lint = Path(sys.executable).with_name("lint-imports")

    def lint_imports() -> subprocess.CompletedProcess:
        return subprocess.run([str(lint), "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
                              env={"PYTHONPATH": str(tmp_path / "src"), "PATH": "/usr/bin:/bin"})

    broken = lint_imports()
    assert broken.returncode == 1, broken.stdout
    assert "BROKEN" in broken.stdout and "memsweep.config.choices -> memsweep.run.results" in broken.stdout
    schema.write_text(schema.read_text().split("\n\ndef _up():")[0])
    assert lint_imports().returncode == 0
