"""spotpipe command-line tools, and `spotpipe.load_model(DIR)`: a trained job's weights as an
`nn.Sequential` (torch + safetensors only; importing spotpipe imports neither torch nor Django)."""

from __future__ import annotations

from typing import Any

__all__ = ["load_model"]


def __getattr__(name: str) -> Any:
    if name == "load_model":
        from runtime.checkpointing.export import load_model

        return load_model
    raise AttributeError(f"module 'spotpipe' has no attribute {name!r}")
