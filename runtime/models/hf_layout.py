"""The files of the Hugging Face GPT-2 folder written beside a job's weights (`export = "hf"`), named
once and without torch: the control plane lists and serves them (`controlplane.jobs.artifacts`)."""

from __future__ import annotations

HF_FOLDER = "hf"
CONFIG = "config.json"
HF_WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
HF_FILES = (HF_WEIGHTS, TOKENIZER, TOKENIZER_CONFIG, CONFIG)
"""In the order they are written: config.json last, so a folder that has it has the rest."""
