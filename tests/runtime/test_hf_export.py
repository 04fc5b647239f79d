"""Weights Hugging Face loads: `spotpipe train --export hf` (and `spotpipe export-hf`) write a GPT-2
folder that `transformers` loads with the same logits as spotpipe's own model, with the byte tokenizer
as a tokenizer.json that encodes and decodes as spotpipe does; `load_model`, `sample` and
`--init-from` read it back. Bad requests are one message before anything runs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

import spotpipe
from runtime.data.tokenizer import ByteTokenizer, byte_tokenizer_json
from spotpipe.train import TrainOptions, run_export_hf, run_train
from tests.runtime.test_train_command import CORPUS, _job_file

TEXTS = ("hello world", "héllo\n\n wörld ✓ 日本", "  tabs\tand\r\nbytes")


def _train(options: TrainOptions) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return run_train(options, out=out, err=err), out.getvalue(), err.getvalue()


def test_the_byte_tokenizer_as_a_tokenizer_json_encodes_and_decodes_as_spotpipe_does() -> None:
    from tokenizers import Tokenizer

    theirs, ours = Tokenizer.from_str(byte_tokenizer_json()), ByteTokenizer()
    assert theirs.get_vocab_size() == ours.vocab_size == 256
    for text in TEXTS:
        ids = theirs.encode(text, add_special_tokens=False).ids
        assert ids == list(ours.encode(text))
        assert theirs.decode(ids) == text


@pytest.mark.runtime
@pytest.mark.timeout(300)
def test_a_trained_gpt_loads_in_transformers_with_spotpipes_logits(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = tmp_path / "out"
    code, out, err = _train(TrainOptions(file=_job_file(tmp_path), data=f"text:{CORPUS}", pp=2, microbatches=2,
                                         steps=3, export="hf", out=out_dir))
    assert code == 0, err
    hf_dir = out_dir / "hf"
    assert f"Hugging Face folder: {hf_dir}" in out
    config = json.loads((hf_dir / "config.json").read_text())
    assert (config["model_type"], config["n_positions"], config["tie_word_embeddings"]) == ("gpt2", 16, False)

    theirs = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    ours = spotpipe.load_model(out_dir)
    ids = torch.tensor([list(ByteTokenizer().encode("def main(argv):\n"))])  # 16 tokens: the context
    with torch.no_grad():
        expected = ours(ids)
        torch.testing.assert_close(theirs(ids).logits, expected, rtol=0, atol=1e-5)
        # The folder reads back through spotpipe too: load_model, and --init-from's reader.
        torch.testing.assert_close(spotpipe.load_model(hf_dir)(ids), expected, rtol=0, atol=0)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    for text in TEXTS:
        assert tokenizer.encode(text, add_special_tokens=False) == list(ByteTokenizer().encode(text))
    from runtime.models.load import initial_state
    from spotpipe.train import TrainOptions as Options
    from spotpipe.train import resolve_config

    assert initial_state(str(hf_dir), resolve_config(Options(file=_job_file(tmp_path))).model).start_step == 0

    sampled, problems = io.StringIO(), io.StringIO()
    from spotpipe.sample import run_sample

    assert run_sample(str(hf_dir), prompt="def ", tokens=8, out=sampled, err=problems) == 0, problems.getvalue()
    assert sampled.getvalue().startswith("def ")

    # spotpipe export-hf on the same folder, elsewhere: the same files.
    again = tmp_path / "again"
    assert run_export_hf(str(out_dir), again, out=io.StringIO(), err=io.StringIO()) == 0
    assert (again / "model.safetensors").read_bytes() == (hf_dir / "model.safetensors").read_bytes()


@pytest.mark.parametrize(("options", "message"), [
    (dict(model="tests.usermodels.models:two_layers", data="py:tests.usermodels.models:regression"),
     "export = 'hf' writes a Hugging Face GPT-2 folder, for the gpt presets; the model is 'py'"),
])
def test_export_hf_of_a_model_it_cannot_write_is_one_message_before_anything_runs(
        tmp_path: Path, options: dict, message: str) -> None:
    out_dir = tmp_path / "out"
    code, _, err = _train(TrainOptions(export="hf", out=out_dir, **options))
    assert code == 2 and message in err, err
    assert not out_dir.exists()


def test_export_and_tracking_in_a_job_file_are_sent_by_submit(tmp_path: Path, submitted: list[dict]) -> None:
    """A job file's top-level `export` is the contract's `config.export` (the node that completes the
    export writes the format); written in both places differently, it is one error and nothing is sent."""
    from spotpipe import commands

    sent = submitted
    path = _job_file(tmp_path)
    path.write_text('export = "hf"\ntracking = ["mlflow"]\n' + path.read_text())
    assert commands.submit(path, out=io.StringIO(), err=io.StringIO()) == 0
    assert sent[0]["config"]["export"] == "hf" and "export" not in sent[0]
    assert sent[0]["tracking"] == ["mlflow"]  # the control plane logs it (tests/controlplane/test_job_tracking.py)
    path.write_text(path.read_text().replace("[config]\n", '[config]\nexport = "onnx"\n'))
    err = io.StringIO()
    assert commands.submit(path, out=io.StringIO(), err=err) == 2 and len(sent) == 1
    assert "export = 'hf' and config.export = 'onnx'; expected one of them" in err.getvalue()


def test_export_hf_of_a_folder_without_a_gpt_is_refused(tmp_path: Path) -> None:
    (tmp_path / "spotpipe.json").write_text(json.dumps({"model": {"kind": "mlp"}}))
    err = io.StringIO()
    assert run_export_hf(str(tmp_path), None, out=io.StringIO(), err=err) == 2
    assert "holds a 'mlp' model" in err.getvalue()


def _gpt_folder(folder: Path) -> Path:
    """A gpt preset's weights folder as a run leaves it (weights and spotpipe.json), without training."""
    from runtime.checkpointing.export import export_model
    from runtime.config import ModelSpec
    from runtime.models.model import build_model

    spec = ModelSpec(kind="gpt", n_layer=1, n_embd=16, n_head=2, seq_len=16, vocab_size=256)
    export_model(folder, build_model(spec, 0), spec=spec, info={"tokenizer": "byte"})
    return folder


def test_export_hf_never_writes_over_the_weights_folder_nor_another_runs_weights(tmp_path: Path) -> None:
    source, other = _gpt_folder(tmp_path / "run"), _gpt_folder(tmp_path / "other")
    (other / "notes.txt").write_text("mine")
    kept = {p: p.read_bytes() for folder in (source, other) for p in folder.iterdir()}

    def export(target: Path | None, **kw) -> tuple[int, str]:
        err = io.StringIO()
        return run_export_hf(str(source), target, out=io.StringIO(), err=err, **kw), err.getvalue()

    for overwrite in (False, True):  # the folder itself: never, --overwrite or not
        code, err = export(source, overwrite=overwrite)
        assert code == 2 and f"the Hugging Face folder {source} is the weights folder {source} itself" in err, err
    code, err = export(other)
    assert code == 2 and f"{other} already holds weights (model.safetensors, spotpipe.json)" in err, err
    assert "--overwrite" in err
    assert {p: p.read_bytes() for folder in (source, other) for p in folder.iterdir()} == kept
    assert export(None) == (0, "") and export(None) == (0, "")  # DIR/hf: rewritten from the same weights
    code, _ = export(other, overwrite=True)  # replaced whole: no spotpipe.json left to describe other weights
    assert code == 0 and sorted(p.name for p in other.iterdir()) == [
        "config.json", "model.safetensors", "notes.txt", "tokenizer.json", "tokenizer_config.json"]
    assert (other / "model.safetensors").read_bytes() == (source / "hf" / "model.safetensors").read_bytes()
    code, err = export(tmp_path / "copy")
    assert code == 0 and export(tmp_path / "copy")[0] == 2  # another Hugging Face folder: --overwrite replaces it
    assert export(tmp_path / "copy", overwrite=True) == (0, "")
    assert {p: p.read_bytes() for p in source.iterdir() if p.is_file()} == {
        p: v for p, v in kept.items() if p.parent == source}  # the source's own weights, untouched throughout
