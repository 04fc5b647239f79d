"""One node's share of a job's prepare step (`runtime.data.prepare_share`, what the agent runs) and
the `data.prepare` field's checks: the shares together make the corpus one prepare makes, a
location holding the same source's corpus is taken as it is, another source's is refused."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from runtime.config import DataSpec
from runtime.data.errors import DataError
from runtime.data.prepare import prepare
from runtime.data.prepare_share import run_share

from .test_shards import stream_tokens, write_corpus


def test_two_shares_make_the_corpus_one_prepare_makes(tmp_path):
    write_corpus(tmp_path / "corpus", count=5)
    source = f"text:{tmp_path / 'corpus'}"
    whole = prepare(source, tokenizer="byte", out=str(tmp_path / "whole"), stream=io.StringIO())
    out = str(tmp_path / "shared")
    first = run_share(source=source, tokenizer="byte", out=out, share=(0, 2), workers=1)
    assert first["index_written"] is False and first["waiting"] > 0 and first["files"] >= 2
    second = run_share(source=source, tokenizer="byte", out=out, share=(1, 2), workers=1)
    assert second["index_written"] is True and second["files"] + first["files"] == 5
    assert (stream_tokens(out) == stream_tokens(str(tmp_path / "whole"))).all()
    assert json.loads((tmp_path / "shared" / "index.json").read_text())["content_hash"] == whole.index.content_hash
    again = run_share(source=source, tokenizer="byte", out=out, share=(0, 2), workers=1)
    assert again["prepared_before"] is True and again["index_written"] is True and again["files"] == 0


def test_a_location_prepared_from_another_source_is_refused(tmp_path):
    write_corpus(tmp_path / "a", count=2)
    write_corpus(tmp_path / "b", count=2, seed=7)
    out = str(tmp_path / "prepared")
    run_share(source=f"text:{tmp_path / 'a'}", tokenizer="byte", out=out, share=(0, 1), workers=1)
    with pytest.raises(DataError, match=r"already holds a corpus prepared from .*text:.*/a.*choose another"):
        run_share(source=f"text:{tmp_path / 'b'}", tokenizer="byte", out=out, share=(0, 1), workers=1)


def test_the_module_prints_one_line_of_json_and_exit_2_for_bad_data(tmp_path):
    write_corpus(tmp_path / "corpus", count=2)
    ran = subprocess.run([sys.executable, "-m", "runtime.data.prepare_share", "--source", f"text:{tmp_path / 'corpus'}",
                          "--tokenizer", "byte", "--out", str(tmp_path / "p"), "--share", "0/1", "--workers", "1"],
                         capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.splitlines()[-1])["index_written"] is True
    assert "files" in ran.stderr  # the progress goes to stderr, for the agent's log
    missing = subprocess.run([sys.executable, "-m", "runtime.data.prepare_share", "--source",
                              f"text:{tmp_path / 'nothing-here'}", "--tokenizer", "byte", "--out", str(tmp_path / "q"),
                              "--share", "0/1"], capture_output=True, text=True, check=False)
    assert missing.returncode == 2
    assert "nothing-here" in json.loads(missing.stdout.splitlines()[-1])["error"]


@pytest.mark.parametrize(("source", "prepare_to", "expected"), [
    ("", "/data/prepared", "needs a data.source"),
    ("tokens:/data/train.bin", "/data/prepared", "only text, jsonl, hf, wds, mds sources are prepared"),
    ("text:/data/corpus", "http://example.com/x", "expected a folder or an s3://bucket/prefix/"),
    ("text:/data/corpus", "s3://Bad_Bucket/p/", "not a valid bucket name"),
    ("text:/data/corpus", "/data/*", "(not a glob)"),
])
def test_bad_prepare_fields_name_data_prepare(source, prepare_to, expected):
    problems = DataSpec(source=source, prepare=prepare_to).problems()
    assert [p.field for p in problems] == ["data.prepare"]
    assert expected in problems[0].message


def test_a_good_prepare_field_has_no_problem():
    assert DataSpec(source="text:s3://corpus-bucket/raw/", prepare="s3://corpus-bucket/prepared/").problems() == []
    assert DataSpec(source="jsonl:/data/*.jsonl?field=body", prepare="/data/prepared").problems() == []
