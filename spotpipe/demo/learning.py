"""What the demo's job learned: its validation loss beside what the corpus alone gives (the unigram
entropy) and what a model that learned nothing gets (ln vocab), and a few lines sampled from it."""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path
from typing import Any

LEARNED_FRACTION = 0.8
"""The demo has learned when its validation loss is at most this fraction of the unigram entropy."""
SAMPLE_PROMPTS = ("def ", "class ", "import ")
SAMPLE_TOKENS = 160


def corpus_source() -> str:
    """The demo's corpus: the Python standard library's own source files (on every machine that runs
    spotpipe, nothing to download), read by the byte tokenizer."""
    return f"text:{Path(sysconfig.get_paths()['stdlib'])}/*.py"


def learning_summary(config: dict[str, Any], *, val_loss: float | None, weights: str) -> dict[str, Any]:
    """The figures `learning_lines` prints (and the demo's summary JSON holds)."""
    from runtime.config import JobConfig
    from runtime.data.dataset import Batches
    from runtime.data.stats import unigram_entropy
    from runtime.data.tokenizer import ByteTokenizer
    from runtime.models.generate import sample
    from runtime.models.load import load_model

    job = JobConfig.from_dict(config)
    batches = Batches(job)  # the nodes filled this machine's cache: opening it reads no corpus again
    entropy = unigram_entropy(batches.dataset.train.tokens, job.model.vocab_size)
    summary: dict[str, Any] = {
        "data_source": job.data.source,
        "data_content_hash": batches.dataset.description.get("content_hash"),
        "val_loss": val_loss,
        "unigram_entropy_nats": entropy,
        "ln_vocab_nats": math.log(job.model.vocab_size),
        "val_loss_over_unigram_entropy": val_loss / entropy if val_loss is not None else None,
        "learned": val_loss is not None and val_loss <= LEARNED_FRACTION * entropy,
        "samples": [],
    }
    try:
        model = load_model(weights)  # the job's exported weights, as a team would load them
    except (ValueError, OSError) as exc:
        summary["samples_error"] = str(exc)
        return summary
    tokenizer = ByteTokenizer()
    for i, prompt in enumerate(SAMPLE_PROMPTS):
        ids = sample(model, job.model, list(tokenizer.encode(prompt)), SAMPLE_TOKENS, seed=i)
        summary["samples"].append(prompt + tokenizer.decode(ids))
    return summary


def learning_lines(summary: dict[str, Any]) -> list[str]:
    """The demo's closing words on learning."""
    val = summary["val_loss"]
    lines = [
        f"Learning: {summary['data_source']} (byte-level, content {str(summary['data_content_hash'])[:12]})",
        f"  validation loss        {val:.3f} nats/byte" if val is not None else "  validation loss        none",
        f"  unigram entropy        {summary['unigram_entropy_nats']:.3f}  (a model of byte frequencies alone)",
        f"  ln(vocab)              {summary['ln_vocab_nats']:.3f}  (a model that learned nothing)",
        f"  learned: {'yes' if summary['learned'] else 'NO'} (validation loss "
        f"{'<=' if summary['learned'] else '>'} {LEARNED_FRACTION} x the unigram entropy)",
    ]
    if summary["samples"]:
        lines.append("  sampled from the trained model (temperature 0.8):")
        for text in summary["samples"]:
            lines.extend(f"    | {line}" for line in text.splitlines()[:4])
    elif summary.get("samples_error"):
        lines.append(f"  no samples: {summary['samples_error']}")
    return lines
