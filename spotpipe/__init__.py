"""spotpipe command-line tools, `spotpipe.load_model(DIR)`: a trained job's weights as an
`nn.Sequential` (torch + safetensors only; importing spotpipe imports neither torch nor Django), and
`spotpipe.Model`: what a model function may return to declare its context and vocabulary."""

from __future__ import annotations

from typing import Any

__all__ = ["Model", "load_model"]


def __getattr__(name: str) -> Any:
    if name == "load_model":
        from runtime.models.load import load_model

        return load_model
    if name == "Model":  # what a model function may return: its layers and what the data need
        from runtime.models.declaration import Model

        return Model
    raise AttributeError(f"module 'spotpipe' has no attribute {name!r}")
