"""mkdocs hooks (mkdocs.yml `hooks:`): the site's pages that must not drift from the code, written at build time.

- One page per config group (`groups/<group>.md`) from its option files (conf/<group>/*.yaml: what each option
  sets, its leading comment), its keys (the group's dataclass in src/memsweep/config/ (SCHEMA_FILES), with each key's
  type, default and comment; a closed set's values from config/choices.py) and its module's docstring. The
  presets (experiment and the groups whose options are an experiment's rows) share one page.
  What a key takes is said as a refusal of it says it (memsweep.config.constraints.describe).
- benchmarks/'s Markdown (findings, the measurement diary, results, the published tables) is brought into the site
  under `benchmarks/`: it stays beside the scripts that write it.
- A relative link between the repository's files (`../benchmarks/FINDINGS.md` from docs/index.md) is pointed at
  the page the site makes of that file, so a link works both on the repository and on the site.

Of memsweep only config.schema and config.constraints are imported (no torch): the modules' docstrings are read
with ast.
"""
import ast
import dataclasses
import io
import posixpath
import re
import tokenize
import typing
from enum import Enum
from pathlib import Path
from typing import NamedTuple

import yaml
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SRC = ROOT / "src" / "memsweep"
MOUNTED = "benchmarks"  # a folder outside docs/ whose Markdown files the site shows under the same path
# Groups whose options are an experiment or its rows (`@package _global_`, no schema section): one page.
PRESETS = ("experiment", "ladder", "llm_demo", "hparams_search")
NOT_A_GROUP = ("hydra",)  # Hydra's own groups (conf/hydra/launcher, conf/hydra/help)
# The module that reads a group that has none in techniques/.
READERS = {"model": "memsweep.run.model", "data": "memsweep.run.data", "task": "memsweep.run.task",
           "hardware": "memsweep.config.hardware", "logger": "memsweep.sweep.wandb_log"}

# The modules of config/ whose dataclasses are Config's sections (schema.Config, and the keys apart from the groups).
SCHEMA_FILES = ("schema.py", "running.py", "planning.py")

# Site page (src_uri) -> the repository file it is made from; filled by on_files.
SITE_TO_REPO: dict[str, str] = {}


class Key(NamedTuple):
    name: str
    type: str
    default: str
    note: str


class Section(NamedTuple):
    dataclass: str
    module: str  # its file in src/memsweep/config/
    keys: list[Key]


class Option(NamedTuple):
    name: str
    summary: str  # the file's leading comment
    sets: list[str]  # `key=value` for every value it sets; `group=option` for every default it overrides
    text: str  # the file itself


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on it (without `#`)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0]: t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT}


def _note(stmt: ast.AnnAssign, lines: list[str], comments: dict[int, str]) -> str:
    """The comment lines right above a field and the comment at its end."""
    above, row = [], stmt.lineno - 1
    while row >= 1 and lines[row - 1].strip().startswith("#"):
        above.insert(0, comments[row])
        row -= 1
    return " ".join(above + ([comments[stmt.lineno]] if stmt.lineno in comments else []))


def field_notes() -> dict[tuple[str, str], str]:
    """(dataclass, field) -> the comments its module writes beside the field: the only place they are."""
    notes = {}
    for name in SCHEMA_FILES:
        source = (SRC / "config" / name).read_text()
        lines, comments = source.splitlines(), _comments(source)
        notes |= {(node.name, stmt.target.id): _note(stmt, lines, comments)
                  for node in ast.parse(source).body if isinstance(node, ast.ClassDef)
                  for stmt in node.body if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)}
    return notes


def _default(field: dataclasses.Field) -> str:
    value = field.default_factory() if field.default is dataclasses.MISSING else field.default
    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
        return "(required)"
    if isinstance(value, Enum):
        return str(value.value)
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def schema_sections() -> dict[str, Section]:
    """Config key (a group's section) -> its dataclass and each key with what it takes, in the words a refusal
    of it uses (constraints.describe), its default and its comment in its module."""
    from memsweep.config.constraints import describe
    from memsweep.config.schema import Config

    notes = field_notes()
    sections = {}
    for section in dataclasses.fields(Config):
        cls = section.default_factory
        if not dataclasses.is_dataclass(cls):
            continue
        hints = typing.get_type_hints(cls, include_extras=True)
        sections[section.name] = Section(cls.__name__, cls.__module__.rsplit(".", 1)[1] + ".py", [
            Key(f.name, describe(hints[f.name]), _default(f),
                notes[(cls.__name__, f.name)] if (cls.__name__, f.name) in notes else "")
            for f in dataclasses.fields(cls)])
    return sections


def _flatten(data: object, prefix: str) -> list[str]:
    if isinstance(data, dict) and data:
        return [item for key, value in data.items() for item in _flatten(value, f"{prefix}.{key}" if prefix else key)]
    shown = "null" if data is None else str(data)
    return [f"{prefix}={shown if len(shown) <= 60 else shown[:57] + '...'}"]


def read_option(group: str, path: Path) -> Option:
    """An option file: its leading comment, what it sets (with its package's prefix) and its text."""
    text = path.read_text()
    lines = text.splitlines()
    global_package = bool(lines) and lines[0].strip() == "# @package _global_"
    leading = []
    for line in lines[1 if global_package else 0:]:
        if not line.startswith("#"):
            break
        leading.append(line.lstrip("#").strip())
    data = yaml.safe_load(text) or {}
    overrides = [f"{k.removeprefix('override /')}={v}" for entry in data.pop("defaults", [])
                 if isinstance(entry, dict) for k, v in entry.items()]
    sets = overrides + _flatten(data, "" if global_package else group)
    return Option(path.stem, " ".join(leading), sets, text)


def default_options() -> dict[str, str]:
    """Group -> its option in conf/config.yaml's defaults list."""
    entries = yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]
    return {k.removeprefix("optional "): "null" if v is None else str(v) for entry in entries
            if isinstance(entry, dict) for k, v in entry.items()}


def _first_sentence(text: str) -> str:
    """Up to the first full stop that ends a sentence (not `e.g.`); the option file below has the rest."""
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.(\s|$)", text)
    return text[:end.start() + 1] if end is not None else text


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def options_markdown(group: str) -> list[str]:
    """The options table and each option file, verbatim."""
    options = [read_option(group, p) for p in sorted((CONF / group).glob("*.yaml"))]
    lines = ["| option | what it is | what it sets |", "|---|---|---|"]
    lines += [f"| [`{o.name}`](#{group}-{o.name}) | {_cell(_first_sentence(o.summary)) or '-'} | "
              f"{_cell(', '.join(f'`{s}`' for s in o.sets)) or '-'} |" for o in options]
    lines += ["", f"### The option files (`conf/{group}/`)", ""]
    for o in options:
        lines += [f"#### {o.name} {{#{group}-{o.name}}}", "", "```yaml", o.text.rstrip(), "```", ""]
    return lines


def keys_markdown(group: str, section: Section) -> list[str]:
    lines = [f"`{group}.<key>=<value>` sets one for a job; typed by `{section.dataclass}` in "
             f"`src/memsweep/config/{section.module}`, so a key it lacks or a value of the wrong type is refused "
             "before any work.", "", "| key | takes | default | what it does |", "|---|---|---|---|"]
    lines += [f"| `{group}.{k.name}` | {_cell(k.type)} | `{_cell(k.default)}` | {_cell(k.note) or '-'} |"
              for k in section.keys]
    return lines


def _module(group: str) -> str | None:
    if (SRC / "techniques" / f"{group}.py").is_file():
        return f"memsweep.techniques.{group}"
    return READERS[group] if group in READERS else None


def _docstring_head(module: str) -> str:
    path = ROOT / "src" / (module.replace(".", "/") + ".py")
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def group_page(group: str, section: Section | None, default: str) -> str:
    """One config group's page."""
    lines = [f"# {group}", "", f"`python train.py {group}=<option>` chooses one option; `-m {group}=a,b` sweeps "
             f"several. Default: `{default}` (conf/config.yaml).", ""]
    module = _module(group)
    if module is not None:
        path = "src/" + module.replace(".", "/") + ".py"
        lines += [f"> {_docstring_head(module)}", "", f"Module: [{module}][] (`{path}`).", ""]
    if (Path(__file__).parent / "techniques" / f"{group}.md").is_file():
        lines += [f"Why each choice: [design notes](../techniques/{group}.md).", ""]
    lines += ["## Options", ""] + options_markdown(group)
    if section is not None:
        lines += ["## Keys", ""] + keys_markdown(group, section)
    return "\n".join(lines) + "\n"


def presets_page(defaults: dict[str, str]) -> str:
    """The presets' page: experiments and the groups whose options are their rows."""
    lines = ["# Presets", "", "Each option of these groups is a whole experiment or one row of one "
             "(`# @package _global_`: it sets keys anywhere in the config and overrides other groups). None is "
             "chosen by default.", ""]
    for group in PRESETS:
        chosen = "none by default" if defaults[group] == "null" else f"default: `{defaults[group]}`"
        lines += [f"## {group}", "", f"`python train.py {group}=<option>`; {chosen} (conf/config.yaml).", ""]
        lines += [line.replace("### The option files", "### Its option files") for line in options_markdown(group)]
    return "\n".join(lines) + "\n"


def groups() -> list[str]:
    return sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in NOT_A_GROUP)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the config-group pages and benchmarks/'s Markdown; remember which repository file each page is."""
    sections, defaults = schema_sections(), default_options()
    for group in groups():
        if group in PRESETS:
            continue
        if group not in defaults:
            raise PluginError(f"conf/{group}/ is not in conf/config.yaml's defaults: docs/hooks.py cannot say its "
                              "default (a preset group belongs in PRESETS)")
        content = group_page(group, sections[group] if group in sections else None, defaults[group])
        files.append(File.generated(config, f"groups/{group}.md", content=content))
    files.append(File.generated(config, "groups/presets.md", content=presets_page(defaults)))
    for path in sorted((ROOT / MOUNTED).rglob("*.md")):
        uri = path.relative_to(ROOT).as_posix()
        files.append(File.generated(config, uri, abs_src_path=str(path)))
        SITE_TO_REPO[uri] = uri
    for file in files.documentation_pages():
        if file.src_uri not in SITE_TO_REPO:
            SITE_TO_REPO[file.src_uri] = f"docs/{file.src_uri}"
    return files


LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """A relative link to another repository file the site shows: pointed at that file's page."""
    repo_to_site = {repo: site for site, repo in SITE_TO_REPO.items()}
    here = page.file.src_uri
    folder = posixpath.dirname(SITE_TO_REPO[here]) if here in SITE_TO_REPO else posixpath.dirname(f"docs/{here}")

    def point(match: re.Match) -> str:
        target, anchor = match.group(1), match.group(2) or ""
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        repo = posixpath.normpath(posixpath.join(folder, target))
        if repo not in repo_to_site:
            return match.group(0)
        return f"]({posixpath.relpath(repo_to_site[repo], posixpath.dirname(here) or '.')}{anchor})"

    return LINK.sub(point, markdown)
