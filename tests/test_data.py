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
