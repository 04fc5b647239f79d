"""Writing a finished gpt-preset export as a Hugging Face GPT-2 folder (`export = "hf"`, `spotpipe
train --export hf`, `spotpipe export-hf`): the weights in GPT-2's names (`runtime.models.hf_gpt2`),
the job's tokenizer (`runtime.data.tokenizer`) and the config, config.json last. It sits above the
model, data and checkpointing packages, which it all reads."""

from __future__ import annotations

from pathlib import Path

from runtime.checkpointing.export import (
    WeightsFolder,
    _atomic_write,
    export_files,
    model_of_info,
    read_info,
    spec_of_entry,
    write_json,
)
from runtime.data.tokenizer import byte_tokenizer_json
from runtime.models.hf_gpt2 import HFWeightsError, hf_config, hf_state
from runtime.models.hf_layout import CONFIG, HF_FILES, HF_FOLDER, HF_WEIGHTS, TOKENIZER, TOKENIZER_CONFIG


def write_hf_folder(directory: str | Path, out: str | Path | None = None, *, overwrite: bool = False) -> Path:
    """Write the Hugging Face GPT-2 folder of a finished gpt-preset weights folder `directory`:
    config.json, model.safetensors and the tokenizer the job trained with (tokenizer.json and
    tokenizer_config.json), so `transformers.AutoModelForCausalLM.from_pretrained(out)` loads it.
    `out` defaults to `directory/hf`; config.json is written last, so a folder with one is complete.
    `out` is never `directory` itself; one holding other weights is refused unless `overwrite`,
    which removes them first (`_clear_target`)."""
    from safetensors.torch import save_file

    info = read_info(directory)
    entry = model_of_info(info)
    if entry.get("kind") != "gpt":
        raise HFWeightsError(f"{directory} holds a {entry.get('kind')!r} model; a Hugging Face GPT-2 folder is "
                             "written for the gpt presets only (a model function's weights load into your own "
                             "nn.Sequential with load_state_dict(strict=True): docs/runtime.md)")
    spec = spec_of_entry(entry)
    target = Path(out) if out is not None else Path(directory) / HF_FOLDER
    _clear_target(Path(directory), target, overwrite=overwrite)
    target.mkdir(parents=True, exist_ok=True)
    (target / CONFIG).unlink(missing_ok=True)  # incomplete until written again, last
    tokenizer = info.get("tokenizer") or "byte"
    if tokenizer == "byte":
        tokenizer_json = byte_tokenizer_json()
    elif Path(tokenizer).is_file():
        tokenizer_json = Path(tokenizer).read_text(encoding="utf-8")
    else:
        raise HFWeightsError(f"the job's tokenizer {tokenizer!r} is not a file here; expected 'byte' or the "
                             "tokenizer.json the job trained with")
    _atomic_write(target / TOKENIZER, lambda tmp: Path(tmp).write_text(tokenizer_json, encoding="utf-8"))
    write_json(target / TOKENIZER_CONFIG, {"tokenizer_class": "PreTrainedTokenizerFast",
                                                  "model_max_length": spec.seq_len,
                                                  "clean_up_tokenization_spaces": False})
    state = hf_state(spec, WeightsFolder(directory).state_dict())
    _atomic_write(target / HF_WEIGHTS, lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    write_json(target / CONFIG, hf_config(spec))
    return target


def _clear_target(source: Path, target: Path, *, overwrite: bool) -> None:
    """Refuse a target that would lose weights: the source folder itself (always), or a folder
    holding an export or another Hugging Face folder (unless `overwrite`: those files are removed,
    so two models' files are never mixed). The source's own `hf/` is rewritten from the same weights."""
    if target.resolve() == source.resolve():
        raise HFWeightsError(f"the Hugging Face folder {target} is the weights folder {source} itself: its "
                             f"model.safetensors would be replaced; expected another folder, e.g. {source / HF_FOLDER} "
                             "(the default)")
    held = {*export_files(target), *(target / n for n in HF_FILES if (target / n).is_file())}
    if target.resolve() == (source / HF_FOLDER).resolve():
        held -= {target / n for n in HF_FILES}
    if held and not overwrite:
        raise HFWeightsError(f"{target} already holds weights ({', '.join(sorted(p.name for p in held))}); expected "
                             "a new folder, or --overwrite to replace them")
    for path in held:
        path.unlink()


def write_hf_beside(directory: str) -> str:
    """`write_hf_folder` of a finished export into `directory/hf` (what a job's `export = "hf"` asks of
    the node that completes its export); `directory` may be `s3://bucket/prefix`: the weights are
    read through a local copy and the folder is staged locally, then uploaded in `HF_FILES` order
    (config.json last, so a listing that finds it finds the rest). Returns where it was written."""
    if not str(directory).startswith("s3://"):
        return str(write_hf_folder(directory))
    import shutil
    import tempfile

    import boto3

    from runtime.checkpointing.export import local_folder, s3_location

    source = local_folder(directory)
    staging = Path(tempfile.mkdtemp(prefix="spotpipe-hf-"))
    try:
        written = write_hf_folder(source, staging)
        bucket, prefix = s3_location(directory)
        client = boto3.client("s3")
        for name in HF_FILES:
            client.upload_file(str(written / name), bucket, f"{prefix}{HF_FOLDER}/{name}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(source, ignore_errors=True)
    return f"{str(directory).rstrip('/')}/{HF_FOLDER}"
