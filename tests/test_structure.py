"""The package's shape: no import cycle between its modules (lazy imports inside functions count too),
and no module too long to read top to bottom."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "memsweep"
MAX_LINES = 350


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
    assert "memsweep.estimate.table" in imports_of("memsweep.sweep.estimates", PACKAGE / "sweep" / "estimates.py", known)


def test_no_import_cycle():
    found = modules()
    graph = {name: imports_of(name, path, set(found)) for name, path in found.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_is_too_long_to_read():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


MAX_FUNCTION_LINES = 50


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
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} >= {
        "config", "techniques", "run", "measure", "sweep", "estimate"}
