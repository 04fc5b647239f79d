"""S3 sources (moto), the node's S3 mirror, and Hugging Face tokenizers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from runtime.data.dataset import Batches, DataError, open_dataset
from runtime.data.s3 import fetch
from runtime.data.tokenizer import ByteTokenizer, load_tokenizer

from .conftest import assert_token_batches, corpus, make_config, tail_split


def test_text_folder_on_s3(s3):
    client, bucket = s3
    texts = [corpus(1, 700), corpus(2, 900), corpus(3, 500)]
    for key, text in zip(("corpus/a.txt", "corpus/c.txt", "corpus/sub/b.md"), texts, strict=True):
        client.put_object(Bucket=bucket, Key=key, Body=text.encode())
    client.put_object(Bucket=bucket, Key="corpus-other/x.txt", Body=b"not under the prefix")
    config = make_config(f"text:s3://{bucket}/corpus/")
    assert_token_batches(config, *tail_split(list("\n\n".join(texts).encode()), config))
    # without the trailing slash the prefix is still the folder corpus/, not corpus-other/
    config = make_config(f"text:s3://{bucket}/corpus")
    assert_token_batches(config, *tail_split(list("\n\n".join(texts).encode()), config))


def test_text_object_on_s3(s3):
    client, bucket = s3
    text = corpus(5, 2000)
    client.put_object(Bucket=bucket, Key="books/one.txt", Body=text.encode())
    config = make_config(f"text:s3://{bucket}/books/one.txt")
    assert_token_batches(config, *tail_split(list(text.encode()), config))


def test_tokens_on_s3_folder_and_file(s3):
    client, bucket = s3
    rng = np.random.default_rng(7)
    train, val = rng.integers(0, 256, 700), rng.integers(0, 256, 90)
    client.put_object(Bucket=bucket, Key="tok/train.bin", Body=train.astype(np.uint16).tobytes())
    client.put_object(Bucket=bucket, Key="tok/val.bin", Body=val.astype(np.uint16).tobytes())
    assert_token_batches(make_config(f"tokens:s3://{bucket}/tok/"), train.tolist(), val.tolist())
    config = make_config(f"tokens:s3://{bucket}/tok/train.bin")
    assert_token_batches(config, *tail_split(train.tolist(), config))


def test_jsonl_and_parquet_on_s3(s3):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    client, bucket = s3
    bodies = [corpus(20 + i, 200) for i in range(6)]
    client.put_object(Bucket=bucket, Key="j/a.jsonl", Body="\n".join(json.dumps({"text": b}) for b in bodies).encode())
    config = make_config(f"jsonl:s3://{bucket}/j/")
    assert_token_batches(config, *tail_split(list("\n\n".join(bodies).encode()), config))
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": bodies}), buffer)
    client.put_object(Bucket=bucket, Key="p/data/train-00000-of-00001.parquet", Body=buffer.getvalue())
    config = make_config(f"hf:s3://{bucket}/p/")
    assert_token_batches(config, *tail_split(list("\n\n".join(bodies).encode()), config))


def test_mirror_skips_unchanged_objects_and_follows_changes(s3, cache):
    client, bucket = s3
    client.put_object(Bucket=bucket, Key="m/a.txt", Body=b"first")
    client.put_object(Bucket=bucket, Key="m/b.txt", Body=b"second")
    first = fetch(f"s3://{bucket}/m/", cache)
    stamps = {p.name: p.stat().st_mtime_ns for p in first.files}
    again = fetch(f"s3://{bucket}/m/", cache)
    assert {p.name: p.stat().st_mtime_ns for p in again.files} == stamps  # not downloaded again
    client.put_object(Bucket=bucket, Key="m/a.txt", Body=b"changed!")
    client.delete_object(Bucket=bucket, Key="m/b.txt")
    third = fetch(f"s3://{bucket}/m/", cache)
    assert [p.read_bytes() for p in third.files] == [b"changed!"]
    assert sorted(p.name for p in third.path.rglob("*") if p.is_file()) == ["a.txt"]  # b.txt gone, no part files


def test_s3_missing_bucket_and_empty_prefix(s3):
    _, bucket = s3
    with pytest.raises(DataError, match=r"s3://no-such-bucket-h18/x/: bucket 'no-such-bucket-h18' does not exist"):
        Batches(make_config("text:s3://no-such-bucket-h18/x/"))
    with pytest.raises(DataError, match=rf"s3://{bucket}/nothing/: no objects under s3://{bucket}/nothing/"):
        Batches(make_config(f"tokens:s3://{bucket}/nothing/"))


# -- tokenizers ------------------------------------------------------------------------------------


def write_word_tokenizer(path, words: list[str], eot: bool = True) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", *words, *(["<|endoftext|>"] if eot else [])])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


def test_byte_tokenizer_round_trip():
    tokenizer = ByteTokenizer()
    text = "héllo 日本 🙂"
    assert tokenizer.encode(text).tolist() == list(text.encode())
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert (tokenizer.vocab_size, tokenizer.identity, tokenizer.separator.tolist()) == (256, "byte", [10, 10])


def _word_documents(tmp_path) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(40)]
    docs = [" ".join(words[j] for j in rng.integers(0, 40, 60)) + " unknownword" for _ in range(5)]
    (tmp_path / "docs").mkdir()
    for i, doc in enumerate(docs):
        (tmp_path / "docs" / f"{i}.txt").write_text(doc)
    return words, docs


def test_hf_tokenizer_json_local_and_on_s3(tmp_path, s3, cache):
    from tokenizers import Tokenizer

    words, docs = _word_documents(tmp_path)
    write_word_tokenizer(tmp_path / "tokenizer.json", words)
    reference = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    eot = reference.token_to_id("<|endoftext|>")
    expected = []
    for i, doc in enumerate(docs):
        expected += ([eot] if i else []) + reference.encode(doc, add_special_tokens=False).ids
    config = make_config(f"text:{tmp_path / 'docs'}", tokenizer=str(tmp_path / "tokenizer.json"), vocab=64)
    batches = assert_token_batches(config, *tail_split(expected, config))
    tokenizer = load_tokenizer(str(tmp_path / "tokenizer.json"), cache)
    assert batches.dataset.description["tokenizer"] == str(tmp_path / "tokenizer.json")
    assert tokenizer.identity.startswith("sha256:") and tokenizer.vocab_size == 42
    assert tokenizer.decode(tokenizer.encode("w1 w2")) == "w1 w2"

    client, bucket = s3
    client.put_object(Bucket=bucket, Key="tok/tokenizer.json", Body=(tmp_path / "tokenizer.json").read_bytes())
    config = make_config(f"text:{tmp_path / 'docs'}", tokenizer=f"s3://{bucket}/tok/tokenizer.json", vocab=64)
    assert_token_batches(config, *tail_split(expected, config))
    assert load_tokenizer(f"s3://{bucket}/tok/tokenizer.json", cache).identity == tokenizer.identity


def test_tokenizer_without_end_of_text_joins_documents_with_a_blank_line(tmp_path):
    from tokenizers import Tokenizer

    words, docs = _word_documents(tmp_path)
    write_word_tokenizer(tmp_path / "tokenizer.json", words, eot=False)
    reference = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    separator = reference.encode("\n\n", add_special_tokens=False).ids  # Whitespace: no token at all
    expected = []
    for i, doc in enumerate(docs):
        expected += (separator if i else []) + reference.encode(doc, add_special_tokens=False).ids
    config = make_config(f"text:{tmp_path / 'docs'}", tokenizer=str(tmp_path / "tokenizer.json"), vocab=64)
    assert_token_batches(config, *tail_split(expected, config))


def test_tokenizer_bigger_than_the_model(tmp_path):
    write_word_tokenizer(tmp_path / "tokenizer.json", [f"w{i}" for i in range(300)])
    (tmp_path / "a.txt").write_text("w1 w2 " * 100)
    config = make_config(f"text:{tmp_path / 'a.txt'}", tokenizer=str(tmp_path / "tokenizer.json"), vocab=256)
    with pytest.raises(DataError, match=r"has 302 ids, more than the model's vocabulary \(model.vocab_size=256\)"):
        open_dataset(config.data, config.model)


def test_tokenizer_missing_or_malformed(tmp_path):
    (tmp_path / "a.txt").write_text("x" * 100)
    config = make_config(f"text:{tmp_path / 'a.txt'}", tokenizer=str(tmp_path / "nope.json"))
    with pytest.raises(DataError, match=r"nope.json' does not exist on this node; expected 'byte' or the path"):
        open_dataset(config.data, config.model)
    (tmp_path / "bad.json").write_text("{}")
    config = make_config(f"text:{tmp_path / 'a.txt'}", tokenizer=str(tmp_path / "bad.json"))
    with pytest.raises(DataError, match=r"bad.json is not a Hugging Face tokenizer.json"):
        open_dataset(config.data, config.model)
