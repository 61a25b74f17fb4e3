"""Data sources: the embedded tweets, a user's own CSV/JSONL, hub loading code on local files, bad input."""
import time

import pandas as pd
import pytest

from memsweep.config.schema import DataConf, DataSource
from memsweep.errors import ConfigError
from memsweep.run import data


def tweets(**kw) -> DataConf:
    base = dict(source=DataSource.tweets, labels=["negative", "positive"], encoding="latin-1",
                label_column="sentiment", train_size=2000, eval_size=500)
    return DataConf(**{**base, **kw})


def test_tweets_are_binary_deduplicated_and_stratified():
    train, evaluation, names = data.load_frames(tweets(), seed=0)
    assert names == ["negative", "positive"]
    assert (len(train), len(evaluation)) == (2000, 500)
    assert set(train.text).isdisjoint(evaluation.text) and not train.text.duplicated().any()
    # the corpus is ~70 % negative once neutral is dropped; stratification keeps that share in both
    share = lambda f: (f.label == "negative").mean()  # noqa: E731
    assert abs(share(train) - share(evaluation)) < 0.02 and 0.65 < share(train) < 0.75


def test_split_is_deterministic_by_seed():
    a, _, _ = data.load_frames(tweets(), seed=1)
    b, _, _ = data.load_frames(tweets(), seed=1)
    c, _, _ = data.load_frames(tweets(), seed=2)
    assert a.text.tolist() == b.text.tolist() and a.text.tolist() != c.text.tolist()


def _csv(tmp_path, frame, name="mine.csv"):
    path = tmp_path / name
    if name.endswith(".jsonl"):
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_csv(path, index=False)
    return str(path)


def _frame(n=60):
    return pd.DataFrame({"review": [f"text number {i}" for i in range(n)],
                         "stars": ["good" if i % 3 else "bad" for i in range(n)]})


@pytest.mark.parametrize("name", ["mine.csv", "mine.jsonl"])
def test_a_users_own_file_needs_no_code(tmp_path, name):
    cfg = DataConf(source=DataSource.csv, path=_csv(tmp_path, _frame(), name), text_column="review",
                   label_column="stars", eval_size=12)
    train, evaluation, names = data.load_frames(cfg, seed=0)
    assert names == ["bad", "good"] and len(evaluation) == 12 and len(train) == 48


def test_missing_file_names_the_key(tmp_path):
    with pytest.raises(ConfigError) as err:
        data.load_frames(DataConf(source=DataSource.csv, path=str(tmp_path / "nope.csv")), seed=0)
    assert err.value.key == "data.path" and "does not exist" in str(err.value)


def test_missing_column_lists_the_columns(tmp_path):
    cfg = DataConf(source=DataSource.csv, path=_csv(tmp_path, _frame()), text_column="text", label_column="stars")
    with pytest.raises(ConfigError) as err:
        data.load_frames(cfg, seed=0)
    assert err.value.key == "data.text_column" and "'review'" in str(err.value)


def test_one_class_is_refused(tmp_path):
    frame = _frame().assign(stars="good")
    cfg = DataConf(source=DataSource.csv, path=_csv(tmp_path, frame), text_column="review", label_column="stars",
                   eval_size=10)
    with pytest.raises(ConfigError) as err:
        data.load_frames(cfg, seed=0)
    assert err.value.key == "data.label_column" and "at least 2 classes" in str(err.value)


def test_hub_loading_code_on_a_local_dataset_folder(tmp_path):
    folder = tmp_path / "imdb_like"
    folder.mkdir()
    _frame(40).rename(columns={"review": "text", "stars": "label"}).to_csv(folder / "train.csv", index=False)
    _frame(20).rename(columns={"review": "text", "stars": "label"}).to_csv(folder / "test.csv", index=False)
    cfg = DataConf(source=DataSource.hub, path=str(folder), train_split="train", eval_split="test",
                   text_column="text", label_column="label", train_size=30, eval_size=10)
    train, evaluation, names = data.load_frames(cfg, seed=0)  # through datasets.load_dataset
    assert (len(train), len(evaluation), names) == (30, 10, ["bad", "good"])


def test_unreachable_hub_fails_fast_with_a_clear_message():
    started = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        data.load_frames(DataConf(source=DataSource.hub, path="stanfordnlp/imdb"), seed=0)
    assert time.perf_counter() - started < 5
    assert err.value.key == "data.path" and "offline" in str(err.value)


def test_tokenised_data_is_cached_per_process():
    from transformers import AutoTokenizer

    from memsweep.run.model import embedded_minilm_path

    tok = AutoTokenizer.from_pretrained(embedded_minilm_path())
    first = data.load(tweets(train_size=300, eval_size=100), 0, tok, 64)
    assert data.load(tweets(train_size=300, eval_size=100), 0, tok, 64) is first
    assert data.load(tweets(train_size=300, eval_size=100), 0, tok, 32) is not first
    assert max(len(x) for x in first.train["input_ids"]) <= 64 and set(first.train["labels"]) == {0, 1}


def test_jobs_in_one_process_share_the_tokenised_data_only_for_the_same_data_and_length(tmp_path):
    from conftest import TINY, run_job

    data._TOKENIZED.clear()
    run_job(TINY + ["max_steps=1"], tmp_path / "a")
    first = next(iter(data._TOKENIZED.values()))
    run_job(TINY + ["max_steps=1", "optim=sgd", "precision=bf16"], tmp_path / "b")  # another job, same data
    assert list(data._TOKENIZED.values()) == [first]
    run_job(TINY + ["max_steps=1", "max_seq_len=32"], tmp_path / "c")
    run_job(TINY + ["max_steps=1", "data.train_size=128"], tmp_path / "d")
    assert len(data._TOKENIZED) == 3


# Rows that cannot be used: refused before any work, or dropped under data.drop_invalid=true, never silently.

def _labelled(n=300, empty_labels=(), empty_texts=(), extra=()):
    """n distinct texts labelled bad/good; the rows at these positions with an empty label or text cell."""
    frame = pd.DataFrame({"text": [f"review number {i}" for i in range(n)],
                          "label": ["good" if i % 2 else "bad" for i in range(n)]})
    frame.loc[list(empty_labels), "label"] = None
    frame.loc[list(empty_texts), "text"] = "  "
    return pd.concat([frame, pd.DataFrame(list(extra), columns=["text", "label"])], ignore_index=True)


def _csv_job(path, *more):
    return ["model=tiny", "data=csv", f"data.path={path}", "data.eval_size=20", "logger=none", "max_steps=2",
            "threads=1", *more]


@pytest.mark.parametrize("column", ["label", "text"])
def test_empty_cells_are_refused_with_their_count_and_first_row_before_any_model(tmp_path, capsys, no_work, column):
    from surfaces import assert_refused, refusal, train_py

    bad = list(range(4, 300, 5))  # 60 rows; the first is the 5th data row: row 6 of the file, the header row 1
    frame = _labelled(empty_labels=bad) if column == "label" else _labelled(empty_texts=bad)
    path = _csv(tmp_path, frame)
    outcome = refusal(lambda: train_py(_csv_job(path), tmp_path / "job"), capsys)
    assert_refused(outcome, f"data.{column}_column", f"{len(bad)} of the {len(frame)} rows of file")
    assert f"(the first: row {bad[0] + 2} of the file, the header being row 1)" in outcome[1][0]
    assert "data.drop_invalid=true" in outcome[1][0]


def test_drop_invalid_trains_on_the_rest_and_counts_each_kind_apart(tmp_path, capsys):
    from conftest import run_job

    no_label, no_text = list(range(1, 300, 5)), [3, 8]
    outside = [(f"so-so review {i}", "meh") for i in range(30)]  # a class data.labels leaves out on purpose
    twice = [("review number 0", "bad"), ("review number 2", "bad"), ("review number 4", "bad")]
    path = _csv(tmp_path, _labelled(empty_labels=no_label, empty_texts=no_text, extra=outside + twice))
    res = run_job(_csv_job(path, "data.drop_invalid=true", "data.labels=[bad,good]"), tmp_path / "job")
    assert res["status"] == "ok", res["reason"]
    facts = res["data"]
    assert (facts["rows_read"], facts["invalid_rows_dropped"]) == (300 + len(outside) + len(twice),
                                                                     len(no_label) + len(no_text))
    assert (facts["rows_outside_labels"], facts["duplicate_rows_dropped"]) == (len(outside), len(twice))
    used = facts["rows_read"] - facts["invalid_rows_dropped"] - len(outside) - len(twice)
    assert facts["train_examples"] + facts["eval_examples"] == used
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[memsweep] data:")]
    assert len(lines) == 1 and f"{len(no_label) + len(no_text)} that cannot be used dropped" in lines[0], lines
    assert f"{len(outside)} left out by data.labels" in lines[0] and f"{used} left" in lines[0]


def test_rows_outside_data_labels_are_counted_not_refused(tmp_path):
    frame = _labelled(60, extra=[(f"so-so {i}", "meh") for i in range(7)])
    cfg = DataConf(source=DataSource.csv, path=_csv(tmp_path, frame), text_column="text", label_column="label",
                   labels=["bad", "good"], eval_size=10)
    frames = data.read_frames(cfg, seed=0)
    assert (frames.rows.rows_outside_labels, frames.rows.invalid_rows_dropped) == (7, 0)
    assert "meh" not in set(frames.train.label) | set(frames.eval.label)


def test_a_json_lines_file_names_the_line_and_whole_number_labels_stay_whole(tmp_path):
    frame = _labelled(40, empty_labels=[6]).assign(label=lambda f: f.label.map({"bad": 0, "good": 1}))
    cfg = DataConf(source=DataSource.csv, path=_csv(tmp_path, frame, "mine.jsonl"), text_column="text",
                   label_column="label", eval_size=10)
    with pytest.raises(ConfigError) as err:
        data.read_frames(cfg, seed=0)
    assert err.value.key == "data.label_column" and "1 have no label" in str(err.value)
    assert "(the first: line 7 of the file)" in str(err.value)
    cfg.drop_invalid = True
    assert data.read_frames(cfg, seed=0).names == ["0", "1"]  # not 0.0 and 1.0, as the empty cell made them


def test_the_embedded_tweets_count_what_data_labels_and_duplicates_leave_out():
    raw = pd.read_csv(data.tweets_path(), encoding="latin-1")
    kept = raw[raw.sentiment.isin(["negative", "positive"])]
    rows = data.read_frames(tweets(), seed=0).rows
    assert (rows.rows_read, rows.invalid_rows_dropped) == (len(raw), 0)
    assert (rows.rows_outside_labels, rows.duplicate_rows_dropped) == (len(raw) - len(kept),
                                                                       int(kept.text.duplicated().sum()))


def _hub_folder(tmp_path, train_labels, eval_labels, features=None):
    import datasets

    folder = tmp_path / "hub_like"
    folder.mkdir()
    for split, labels in (("train", train_labels), ("test", eval_labels)):
        texts = [f"{split} text {i}" for i in range(len(labels))]
        datasets.Dataset.from_dict({"text": texts, "label": labels}, features=features).to_parquet(
            str(folder / f"{split}.parquet"))
    return DataConf(source=DataSource.hub, path=str(folder), train_split="train", eval_split="test",
                    text_column="text", label_column="label", eval_size=10)


def test_a_hub_label_that_is_no_class_of_its_classlabel_is_refused_with_its_index(tmp_path):
    import datasets

    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["n", "p"])})
    cfg = _hub_folder(tmp_path, [0, 1] * 15 + [-1, 0], [0, 1] * 10, features)  # -1: an unlabelled row
    with pytest.raises(ConfigError) as err:
        data.read_frames(cfg, seed=0)
    assert err.value.key == "data.label_column" and "1 of the 32 rows of split 'train'" in str(err.value)
    assert "'-1'" in str(err.value) and "(the first: index 30 of the split, 0-based)" in str(err.value)
    cfg.drop_invalid = True
    frames = data.read_frames(cfg, seed=0)
    assert frames.names == ["0", "1"] and frames.rows.invalid_rows_dropped == 1


def test_an_eval_label_the_train_split_has_no_class_for_is_refused(tmp_path):
    cfg = _hub_folder(tmp_path, ["a", "b"] * 15, ["a", "b", "c", "a"] * 5)
    with pytest.raises(ConfigError) as err:
        data.read_frames(cfg, seed=0)
    assert "5 of the 20 rows of split 'test'" in str(err.value) and "['a', 'b']" in str(err.value)
    cfg.drop_invalid = True
    frames = data.read_frames(cfg, seed=0)
    assert set(frames.eval.label) == {"a", "b"} and frames.rows.invalid_rows_dropped == 5
    cfg.drop_invalid, cfg.labels = False, ["a", "b"]  # named classes: the eval split's others are left out
    assert data.read_frames(cfg, seed=0).rows.rows_outside_labels == 5


def test_an_image_whose_label_is_no_digit_is_refused_or_dropped_and_counted(monkeypatch):
    from memsweep.run import images

    pictures, labels = images.digits()
    broken = labels.astype(object)
    broken[[5, 40]] = None, -1
    monkeypatch.setattr(images, "digits", lambda: (pictures, broken))
    cfg = DataConf(source=DataSource.digits, eval_size=360)
    with pytest.raises(ConfigError) as err:
        images.split(cfg, seed=0)
    assert err.value.key == "data.drop_invalid" and f"2 of the {len(labels)}" in str(err.value)
    assert "index 5, 0-based" in str(err.value)
    cfg.drop_invalid, cfg.labels, cfg.eval_size = True, ["1", "7"], 60
    found = images.split(cfg, seed=0)
    assert found.rows.invalid_rows_dropped == 2
    assert found.rows.rows_outside_labels == sum(str(y) not in ("1", "7") for y in broken if y in range(10))
    assert len(found.train_y) + len(found.eval_y) == len(labels) - 2 - found.rows.rows_outside_labels
