"""`spotpipe sample DIR --prompt TEXT --tokens N [--top-k K]`: text from a trained language model's weights
(a gpt preset, or a model function declared a language model)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TextIO


def run_sample(directory: str, *, prompt: str = "", tokens: int = 200, temperature: float = 0.8, seed: int = 0,
               tokenizer: str | None = None, top_k: int | None = None, out: TextIO | None = None,
               err: TextIO | None = None) -> int:
    """Print `prompt` and `tokens` sampled tokens; 0 on success, 2 for a folder or options that cannot.
    `out`/`err` default to the streams of the call (a default bound at import could be a closed one)."""
    out, err = out or sys.stdout, err or sys.stderr
    from runtime.checkpointing.export import (
        ExportError,
        local_folder,
        model_of_info,
        read_info,
        spec_of_entry,
    )
    from runtime.data.dataset import DataError
    from runtime.data.tokenizer import load_tokenizer
    from runtime.models.generate import sample
    from runtime.models.hf_gpt2 import is_hf_gpt2, read_config, spec_of_hf
    from runtime.models.load import load_model

    wrong = [said for bad, said in ((tokens < 0, f"--tokens {tokens}: expected 0 or more"),
                                    (not temperature > 0, f"--temperature {temperature:g}: expected a number above 0 "
                                                          "(lower is more predictable)"),
                                    (top_k is not None and top_k < 1, f"--top-k {top_k}: expected at least 1"))
             if bad]
    for said in wrong:  # each option named on its own line
        print(f"error: {said}", file=err)
    if wrong:
        return 2
    try:
        local = local_folder(directory)
        if is_hf_gpt2(local):  # `spotpipe train --export hf`'s folder: its own tokenizer.json
            spec = spec_of_hf(read_config(local))
            recorded = str(local / "tokenizer.json") if (local / "tokenizer.json").is_file() else "byte"
        else:
            info = read_info(local)
            entry = model_of_info(info)
            spec = spec_of_entry(entry)
            if not spec.is_language_model or spec.seq_len < 1:
                print(f"error: {directory} holds a {entry.get('kind')!r} model that is not a language model; sample "
                      "needs one (a gpt preset, or a model function declared with a vocabulary and context: "
                      "spotpipe.Model(layers, seq_len=..., vocab_size=...), not language_model=false)", file=err)
                return 2
            recorded = info.get("tokenizer") or "byte"
        model = load_model(local)
        tok = load_tokenizer(tokenizer or recorded, Path(tempfile.gettempdir()))
    except (ExportError, DataError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    ids = [int(i) for i in tok.encode(prompt)] if prompt else []
    if not ids:
        ids = [0]  # something to condition on
        prompt_text = ""
    else:
        prompt_text = prompt
    try:
        drawn = sample(model, spec, ids, tokens, temperature=temperature, seed=seed, top_k=top_k)
    except ValueError as exc:
        print(f"error: {exc}", file=err)
        return 2
    print(prompt_text + tok.decode(drawn), file=out)
    return 0
