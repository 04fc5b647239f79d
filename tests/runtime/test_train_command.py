"""`spotpipe train`: flags over a job file, real data, validation, failures, and what it writes; bad
input is one clear message with no process started."""

from __future__ import annotations

import io
import json
import sysconfig
from pathlib import Path

import pytest
import torch

import spotpipe
from spotpipe.train import TrainOptions, run_train

CORPUS = Path(sysconfig.get_paths()["stdlib"]) / "argparse.py"
TINY_GPT = """target_steps = 2
strategy = "recycle"
[config]
global_batch = 8
op_timeout_s = 2.0
[config.model]
kind = "gpt"
n_layer = 2
n_embd = 16
n_head = 2
seq_len = 16
vocab_size = 256
[plan]
dp = 1
pp = 1
"""


def _job_file(tmp_path: Path, config: str = "") -> Path:
    """TINY_GPT, with `config` lines added to its [config] table."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_GPT.replace("[config]\n", f"[config]\n{config}"))
    return path


def _train(options: TrainOptions) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return run_train(options, out=out, err=err), out.getvalue(), err.getvalue()


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_train_on_text_with_flags_over_the_file_a_kill_and_validation(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    code, out, err = _train(TrainOptions(
        file=_job_file(tmp_path, "checkpoint_interval = 3\n"), data=f"text:{CORPUS}", dp=2, pp=2, microbatches=2,
        steps=8, val_every=4,
        lr=0.01, fails=["kill:1@3"], out=out_dir))
    assert code == 0, err
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    # One record per step, in order, none twice, numbered as steps done (as the console and checkpoints).
    assert [r["step"] for r in records] == list(range(1, 9))
    assert [r["step"] for r in records if "val_loss" in r] == [4, 8]
    assert all(r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 16) for r in records)  # 16-token windows
    assert records[-1]["loss"] < records[0]["loss"]
    summary = json.loads((out_dir / "spotpipe.json").read_text())
    assert summary["config"]["dp"] == 2 and summary["config"]["steps"] == 8  # the flags won over the file
    assert summary["config"]["model"]["n_embd"] == 16  # the file's model stayed
    assert summary["data"]["source"] == f"text:{CORPUS}" and len(summary["data"]["content_hash"]) == 64
    assert summary["tokenizer"] == "byte" and summary["final_val_loss"] == records[-1]["val_loss"]
    assert "val " in out and "tok/s" in out and "done: 8 steps" in out
    # The kill is told: a line when the survivors train on, the count in the summary, the record kept.
    (recovery,) = summary["recoveries"]
    assert (recovery["generation"], recovery["lost"], len(recovery["members"])) == (1, [1], 3)
    assert recovery["seconds"] is not None and recovery["seconds"] >= 0 and recovery["steps_redone"] >= 0
    assert "recovery: generation 1: lost rank 1; 3 ranks train on from step" in out
    assert "; 1 recovery (" in out
    assert len(list((out_dir / "ranks").glob("node-*.pt"))) == 3  # the killed rank saved nothing
    # Checkpoints every 3 steps beside the weights, in their format: step 3 (before the kill) and 6
    # (3 steps into the generation after it); each loads like the final weights.
    assert sorted(p.name for p in (out_dir / "checkpoints").iterdir()) == ["step-3", "step-6"]
    checkpoint = spotpipe.load_model(out_dir / "checkpoints" / "step-6")
    assert json.loads((out_dir / "checkpoints" / "step-6" / "spotpipe.json").read_text())["steps_done"] == 6
    final = spotpipe.load_model(out_dir).state_dict()
    assert checkpoint.state_dict().keys() == final.keys()
    assert any(not torch.equal(t, final[k]) for k, t in checkpoint.state_dict().items())  # 2 steps earlier
    # The same metrics as TensorBoard event files (tensorboard is in the dev extra).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out_dir / "tb"))
    events.Reload()
    val = [records[3]["val_loss"], records[7]["val_loss"]]
    assert [e.value for e in events.Scalars("val/loss")] == pytest.approx(val)
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 9))
    assert [e.step for e in events.Scalars("train/samples_per_s")] == list(range(1, 9))


@pytest.mark.parametrize(("options", "message"), [
    (dict(data="txt:corpus"), "data.source 'txt:corpus' is invalid: expected FORMAT:LOCATION"),
    (dict(data="text:/nonexistent/corpus.txt"), "/nonexistent/corpus.txt"),
    (dict(data="tokens:/nonexistent/train.bin"), "token file /nonexistent/train.bin does not exist"),
    (dict(fails=["kill:9@1"]), "rank 9 does not exist; expected 0..0"),
    (dict(fails=["boom"]), "expected KIND:RANK@STEP"),
    (dict(model="gpt-huge"), "model 'gpt-huge' is unknown; expected one of ['gpt-nano', 'gpt2'"),
    (dict(val_every=2), "val_every needs held-out data"),
])
def test_bad_input_is_one_message_and_starts_nothing(tmp_path: Path, options: dict, message: str) -> None:
    out_dir = tmp_path / "out"
    code, _, err = _train(TrainOptions(file=_job_file(tmp_path), out=out_dir, **options))
    assert code == 2
    assert message in err
    assert not (out_dir / "ranks").exists()  # no rank was started


def test_requirements_are_not_installed_here_and_it_says_so(tmp_path: Path) -> None:
    path = tmp_path / "reqs.toml"
    path.write_text(TINY_GPT.replace("[config]\n", '[config]\nrequirements = ["numpy>=1.26"]\n'))
    code, _, err = _train(TrainOptions(file=path, out=tmp_path / "out", data="text:/nonexistent/corpus.txt"))
    assert code == 2  # (stopped by the bad data, after the note)
    assert "note: requirements ['numpy>=1.26'] are not installed by spotpipe train" in err


def test_presets_have_gpt2_shapes_and_take_the_tokenizers_vocabulary(tmp_path: Path) -> None:
    import torch

    from runtime.models.model import build_model
    from spotpipe.train import resolve_config

    text = resolve_config(TrainOptions(model="gpt2", data=f"text:{CORPUS}"))
    assert (text.model.n_layer, text.model.n_head, text.model.n_embd, text.model.seq_len) == (12, 12, 768, 1024)
    assert text.model.vocab_size == 256  # the byte tokenizer's ids
    assert resolve_config(TrainOptions(model="gpt2-xl", data=f"tokens:{tmp_path}")).model.vocab_size == 50257
    with torch.device("meta"):
        params = sum(p.numel() for p in build_model(resolve_config(TrainOptions(model="gpt2")).model, 0).parameters())
    # GPT-2's 124M with its head untied (+ 50,257 x 768).
    assert params == 124_439_808 + 50_257 * 768


@pytest.mark.runtime
@pytest.mark.timeout(300)
def test_mlflow_and_wandb_get_the_config_losses_recoveries_and_the_weights(tmp_path: Path, monkeypatch) -> None:
    import mlflow

    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B without its servers (the files stay under OUT/wandb)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out_dir = tmp_path / "tracked"
    code, _, err = _train(TrainOptions(file=_job_file(tmp_path), data=f"text:{CORPUS}", dp=2, steps=4,
                                       fails=["kill:1@2"], track=["mlflow", "wandb"], out=out_dir))
    assert code == 0, err
    summary = json.loads((out_dir / "spotpipe.json").read_text())
    runs = {t["tracker"]: t for t in summary["tracking"]}
    assert set(runs) == {"mlflow", "wandb"}  # --track replaces the default (no tb/ this time)
    assert not (out_dir / "tb").exists()

    client = mlflow.tracking.MlflowClient(tracking_uri=runs["mlflow"]["where"])
    run = client.get_run(runs["mlflow"]["run_id"])
    assert run.data.params["model.n_embd"] == "16" and run.data.params["dp"] == "2"
    assert run.data.tags["weights"] == str(out_dir.resolve())
    losses = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in losses] == [1, 2, 3, 4]
    assert [m.value for m in losses] == [json.loads(line)["loss"] for line in
                                          (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert client.get_metric_history(run.info.run_id, "recoveries")[-1].value == 1.0

    wandb_dir = Path(runs["wandb"]["where"])
    assert runs["wandb"]["run_id"] and wandb_dir.is_dir() and wandb_dir.is_relative_to(out_dir)
    assert list(wandb_dir.glob("*.wandb")), sorted(p.name for p in wandb_dir.iterdir())


def test_a_tracker_not_installed_or_unknown_is_one_message(tmp_path: Path, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    code, _, err = _train(TrainOptions(file=_job_file(tmp_path), track=["mlflow"], out=tmp_path / "out"))
    assert code == 2 and "tracking 'mlflow' needs the mlflow package: pip install 'spotpipe[mlflow]'" in err
    path = _job_file(tmp_path)
    path.write_text('tracking = ["neptune"]\n' + path.read_text())
    code, _, err = _train(TrainOptions(file=path, out=tmp_path / "out"))
    assert code == 2 and "tracking ['neptune'] is unknown" in err
    assert not (tmp_path / "out" / "ranks").exists()


@pytest.mark.runtime
@pytest.mark.timeout(180)
def test_data_prepare_trains_on_the_prepared_shards_with_the_losses_of_the_source(tmp_path: Path) -> None:
    prepared = tmp_path / "prepared"
    config = f'data = {{source = "text:{CORPUS}", prepare = "{prepared}"}}\n'
    code, out, err = _train(TrainOptions(file=_job_file(tmp_path, config), out=tmp_path / "a"))
    assert code == 0, err
    assert f"preparing text:{CORPUS} into {prepared}" in out and (prepared / "index.json").exists()
    summary = json.loads((tmp_path / "a" / "spotpipe.json").read_text())
    assert summary["data"]["source"] == f"shards:{prepared}"
    code, out, err = _train(TrainOptions(file=_job_file(tmp_path, config), out=tmp_path / "b"))
    assert code == 0 and "(there already)" in out, err  # prepared once: a second run takes it as it is
    code, _, err = _train(TrainOptions(file=_job_file(tmp_path), data=f"text:{CORPUS}", out=tmp_path / "c"))
    assert code == 0, err
    losses = [[json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
              for run in ("a", "b", "c")]
    assert losses[0] == losses[1] == losses[2]  # the shards give the source's samples, bit for bit


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.runtime
@pytest.mark.timeout(240)
def test_an_out_folder_holding_a_run_is_refused_and_overwrite_replaces_that_run_whole(tmp_path: Path) -> None:
    """A sharded run, then a single-file one into the same folder: refused (nothing touched), then
    with --overwrite the old index, shards, optimizer state and checkpoints are gone, so the new
    weights are the ones that load (an old index would have won over them)."""
    out_dir = tmp_path / "run"
    job = _job_file(tmp_path, "checkpoint_interval = 2\n")
    code, _, err = _train(TrainOptions(file=job, data=f"text:{CORPUS}", pp=2, microbatches=2, steps=5, out=out_dir))
    assert code == 0, err
    assert (out_dir / "model.safetensors.index.json").is_file()
    assert sorted(p.name for p in (out_dir / "checkpoints").iterdir()) == ["step-2", "step-4"]
    (out_dir / "notes.txt").write_text("mine")  # not the run's: kept
    before = _files(out_dir)
    code, _, err = _train(TrainOptions(file=job, data=f"text:{CORPUS}", steps=3, out=out_dir))
    assert code == 2 and f"error: --out {out_dir} already holds a run (" in err and "--overwrite" in err, err
    assert _files(out_dir) == before  # refused: nothing removed, nothing written
    code, _, err = _train(TrainOptions(file=job, data=f"text:{CORPUS}", steps=3, out=out_dir, overwrite=True))
    assert code == 0, err
    names = sorted(p.name for p in out_dir.iterdir())
    assert "model.safetensors" in names and (out_dir / "notes.txt").read_text() == "mine"
    assert not [n for n in names if "index" in n or "-of-" in n or n.startswith(".")], names
    assert sorted(p.name for p in (out_dir / "checkpoints").iterdir()) == ["step-2"]  # this run's only
    assert json.loads((out_dir / "spotpipe.json").read_text())["steps_done"] == 3
    assert set(spotpipe.load_model(out_dir).state_dict()) == set(
        spotpipe.load_model(out_dir / "checkpoints" / "step-2").state_dict())


def test_init_from_inside_the_out_folder_it_would_replace_is_refused(tmp_path: Path) -> None:
    out_dir = tmp_path / "run"
    (out_dir / "checkpoints" / "step-2").mkdir(parents=True)
    (out_dir / "metrics.jsonl").write_text("")
    for overwrite in (False, True):
        code, _, err = _train(TrainOptions(file=_job_file(tmp_path), init_from=str(out_dir / "checkpoints" / "step-2"),
                                           out=out_dir, overwrite=overwrite))
        assert code == 2 and "is inside --out" in err and f"expected another --out, e.g. {out_dir}-continued" in err
        assert (out_dir / "checkpoints" / "step-2").is_dir() and (out_dir / "metrics.jsonl").is_file()


@pytest.mark.parametrize(("plan", "message"), [
    ("ppp = 2\n", "error: plan.ppp: unknown plan field(s) ppp; expected some of ['auto', 'provider'"),
    ("dp = 2\npp = 2\nnodes = 2\n", "error: plan.nodes: plan.nodes=2 cannot hold dp=2 x pp=2 = 4 workers"),
    ("dp = 1\npp = 1\nnodes = 3\n", "plan.nodes=3 asks for 2 spare node(s); spotpipe train runs one process per "
                                    "worker (dp=1 x pp=1 = 1) and no spares"),
    ("nodes = true\n", "plan.nodes must be a positive integer, got True"),
])
def test_a_plan_train_cannot_honour_is_refused_as_submit_refuses_it(tmp_path: Path, plan: str, message: str) -> None:
    path = _job_file(tmp_path)
    path.write_text(path.read_text().replace("[plan]\ndp = 1\npp = 1\n", f"[plan]\n{plan}"))
    code, _, err = _train(TrainOptions(file=path, out=tmp_path / "out"))
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()


def test_init_from_weights_of_another_model_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    from runtime.checkpointing.export import export_model
    from runtime.config import ModelSpec
    from runtime.models.model import build_model

    other = ModelSpec(kind="gpt", n_layer=2, n_embd=32, n_head=2, seq_len=16, vocab_size=256)  # the job's is 16 wide
    export_model(tmp_path / "other", build_model(other, 0), spec=other)
    code, _, err = _train(TrainOptions(file=_job_file(tmp_path), data=f"text:{CORPUS}",
                                       init_from=str(tmp_path / "other"), out=tmp_path / "out"))
    assert code == 2 and err.count("\n") == 1, err
    assert f"error: init_from: init_from {tmp_path / 'other'} holds weights of another model (0.wte.weight is " \
           "(256, 32), the model's (256, 16)" in err
    assert not (tmp_path / "out").exists()


def test_a_timeout_is_one_line_naming_the_last_checkpoint_and_how_to_continue(tmp_path: Path, monkeypatch) -> None:
    """The launcher gives up (`TimeoutError`, its ranks ended) after a checkpoint was written: one
    line, exit status 124, the checkpoint and the --init-from that continues from it."""
    import runtime.train.launcher

    out_dir = tmp_path / "out"

    def times_out(config: object, *, out_dir: Path, export_dir: Path, **kwargs: object) -> None:
        step = Path(export_dir) / "checkpoints" / "step-3"
        step.mkdir(parents=True)
        (step / "model.safetensors").write_bytes(b"")  # what marks a checkpoint complete
        raise TimeoutError("job did not finish within 5.0s; still running: [0]")

    monkeypatch.setattr(runtime.train.launcher, "run_local", times_out)
    code, _, err = _train(TrainOptions(file=_job_file(tmp_path), data=f"text:{CORPUS}", timeout_s=5, out=out_dir))
    assert code == 124 and err.count("\n") == 1 and "Traceback" not in err, err
    checkpoint = out_dir / "checkpoints" / "step-3"
    assert err == (f"error: timed out: the run did not finish within --timeout 5 s (0 of 2 steps done) and every rank "
                   f"was stopped; its last checkpoint is {checkpoint} (step 3): continue with the same options plus "
                   f"--init-from {checkpoint} --out {out_dir}-continued\n")
    assert json.loads((out_dir / "spotpipe.json").read_text())["failed"] == "timed out after 5 s"


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_a_run_longer_than_its_timeout_stops_with_one_line(tmp_path: Path) -> None:
    code, _, err = _train(TrainOptions(file=_job_file(tmp_path), data=f"text:{CORPUS}", steps=1_000_000,
                                       timeout_s=2, out=tmp_path / "out"))
    assert code == 124 and err.count("\n") == 1 and err.startswith("error: timed out: the run did not finish within "
                                                                   "--timeout 2 s ("), err


def test_the_timeout_is_no_limit_unless_asked_for() -> None:
    from spotpipe.cli import build_parser

    assert build_parser().parse_args(["train"]).timeout is None and TrainOptions().timeout_s is None
    code, _, err = _train(TrainOptions(timeout_s=0))
    assert code == 2 and "--timeout 0: expected a number of seconds above 0" in err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("old_run", [False, True])
def test_wandb_without_credentials_is_one_line_and_leaves_the_folder_as_it_was(tmp_path: Path, old_run: bool) -> None:
    """A process of its own, as the user runs it (wandb keeps its settings per process: a run
    opened offline earlier in this one would let the next open offline too)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path / "home"), NETRC=str(tmp_path / "home" / ".netrc"),  # no wandb login
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out_dir = tmp_path / "out"
    if old_run:  # --overwrite of an earlier run: it is put back when the new one cannot start
        (out_dir / "ranks").mkdir(parents=True)
        (out_dir / "metrics.jsonl").write_text('{"step": 1}\n')
        (out_dir / "model.safetensors").write_bytes(b"old weights")
    before = _files(out_dir) if old_run else None
    command = [sys.executable, "-m", "spotpipe.cli", "train", str(_job_file(tmp_path)), "--data", f"text:{CORPUS}",
               "--track", "wandb", "--out", str(out_dir), *(["--overwrite"] if old_run else [])]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)
    err = done.stderr
    assert done.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "error: tracking 'wandb' cannot open a run (" in err and "set WANDB_API_KEY" in err
    assert "WANDB_MODE=offline" in err
    if old_run:
        assert _files(out_dir) == before and sorted(p.name for p in out_dir.iterdir()) == [
            "metrics.jsonl", "model.safetensors", "ranks"]
    else:
        assert not out_dir.exists()
