"""Same math on streamed data: a byte-level GPT trained on a corpus prepared once (`spotpipe data
prepare`) and read through `shards:` has the losses, validation losses and parameters of the same
run on the text source itself, bit for bit, failure-free and under a kill (shards on S3, moto, with a
page cache smaller than the corpus), a notice, and a kill with a replacement joining (dp 2 -> 1 -> 2).
A shard gone before the first step fails the job once, naming it."""

from __future__ import annotations

import io
import sysconfig
import time
from pathlib import Path

import pytest

from runtime.config import DataSpec, DeviceTime
from runtime.data.location import open_location
from runtime.data.prepare import prepare
from runtime.data.prepared import read_index
from runtime.train.launcher import Fault, Join, run_local
from runtime.train.reference import reference_run
from tests.runtime.conftest import assert_same_math
from tests.runtime.data.conftest import moto_s3, s3  # noqa: F401 (fixtures)
from tests.runtime.test_real_data import assert_same_validation, text_config

pytestmark = [pytest.mark.runtime, pytest.mark.timeout(180)]

CORPUS = Path(sysconfig.get_paths()["stdlib"]) / "argparse.py"
SHARDS = {"shard_bytes": 16384, "page_bytes": 1024}


@pytest.fixture(scope="module")
def corpus_source(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "argparse.py").write_bytes(CORPUS.read_bytes())
    return f"text:{folder}"


@pytest.fixture(scope="module")
def prepared(corpus_source, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("prepared") / "argparse"
    prepare(corpus_source, tokenizer="byte", out=str(out), **SHARDS, stream=io.StringIO())
    return str(out)


@pytest.fixture(autouse=True)
def node_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPOTPIPE_DATA_CACHE", str(tmp_path / "node-cache"))
    return tmp_path / "node-cache"


def streamed_config(source: str, **kw):
    config = text_config(Path("unused"), **kw)
    config.data = DataSpec(source=source, val_batches=2)
    return config


def test_the_streamed_run_is_the_text_run(corpus_source, prepared):
    on_text, on_shards = streamed_config(corpus_source), streamed_config(f"shards:{prepared}")
    text_run, shards_run = reference_run(on_text), reference_run(on_shards)
    assert text_run.losses == shards_run.losses  # floats compared exactly: bit for bit
    assert text_run.val_losses == shards_run.val_losses
    assert text_run.losses[-1] < text_run.losses[0]


def test_a_kill_streaming_from_s3_through_a_small_cache_keeps_the_math(prepared, s3, node_cache):  # noqa: F811
    client, bucket = s3
    index = read_index(open_location(prepared))
    for name in ("index.json", *(s.name for s in index.streams["all"])):
        client.put_object(Bucket=bucket, Key=f"argparse/{name}", Body=(Path(prepared) / name).read_bytes())
    assert index.total_bytes > 1 << 16
    config = streamed_config(f"shards:s3://{bucket}/argparse/", strategy="recycle")
    config.data.cache_bytes = 1 << 16  # smaller than the corpus: pages are evicted while training
    result = run_local(config, faults=[Fault(node=1, kind="kill", step=2)], timeout_s=150)
    assert result.exit_codes[1] == -9, result.exit_codes
    assert_same_math(result, config)
    assert_same_validation(result, config)
    # Each rank's prefetch process (named by this test's own cache) ended with its rank, killed or not.
    deadline = time.monotonic() + 60
    while prefetchers_of(node_cache) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert prefetchers_of(node_cache) == []


def prefetchers_of(cache: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"runtime.data.pagefetch" in argv and any(str(cache).encode() in arg for arg in argv):
            found.append(int(proc.name))
    return found


def test_a_notice_and_a_replacement_keep_the_math(prepared):
    config = streamed_config(f"shards:{prepared}", strategy="recycle")
    result = run_local(config, faults=[Fault(node=2, kind="notice", step=2)], timeout_s=150)
    assert result.exit_codes[2] == 0, result.exit_codes
    assert_same_math(result, config)
    assert_same_validation(result, config)

    grown = streamed_config(f"shards:{prepared}", strategy="recycle", schedule="fiw", steps=12,
                            device_time=DeviceTime(forward_ms=4.0), val_every=0)
    result = run_local(grown, faults=[Fault(node=1, kind="kill", step=1)], joins=[Join(node=4, after_step=2)],
                       timeout_s=150)
    assert_same_math(result, grown)
    joined = [r for r in result.records if r.get("event") == "generation" and r["node"] == 4]
    assert joined and len(joined[0]["members"]) == 4, "the replacement did not join"


def test_shards_gone_fail_the_job_once_naming_one(prepared, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(prepared, copy)
    for shard in read_index(open_location(str(copy))).streams["all"]:
        (copy / shard.name).unlink()  # the index is still there: the job starts, its first step cannot read
    config = streamed_config(f"shards:{copy}", strategy="recycle")
    result = run_local(config, timeout_s=120)
    failures = {r["reason"] for r in result.records if r.get("event") == "job_failed"}
    named = [f for f in failures if f.startswith(f"data: {copy}/shards/all-") and " is missing" in f]
    assert failures and len(named) == len(failures), failures
    assert all(code not in (0, None) for code in result.exit_codes.values()), result.exit_codes
    assert not result.steps()
