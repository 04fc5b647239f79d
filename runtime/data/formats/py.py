"""`py:package.module:function`: a user's map-style dataset, built by a function importable on
every node (installed, or on PYTHONPATH). It returns an object with `__len__` and
`__getitem__(i) -> (input, target)` (tensors or what `torch.as_tensor` takes, the same shapes for
every item). If the function takes a `split` keyword it is called with split="train" and
split="val"; otherwise it is called once and its last `val_fraction` of the items (at least one)
are held out. Not cached: the function builds its data itself, and must build the same items in
the same order on every node.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

from runtime.config import DataSpec, ModelSpec, SourceURI
from runtime.data.dataset import DataError, Dataset, MapSplit

EXPECTED = "a map-style dataset: __len__ and __getitem__(i) -> (input, target)"


def load_function(location: str) -> Any:
    module_name, _, name = location.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # anything the module raises at import time is the user's error to see
        raise DataError(f"py:{location}: importing {module_name!r} failed ({type(exc).__name__}: {exc}); "
                        "expected a module importable on every node") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise DataError(f"py:{location}: module {module_name!r} has no function {name!r}")
    return function


def build(function: Any, location: str, **kwargs: Any) -> Any:
    """Call the user's function and check what it returned (and its first item)."""
    try:
        items = function(**kwargs)
    except Exception as exc:
        raise DataError(f"py:{location}{kwargs or ''} raised {type(exc).__name__}: {exc}") from None
    if not (hasattr(items, "__len__") and hasattr(items, "__getitem__")):
        raise DataError(f"py:{location} returned {type(items).__name__}; expected {EXPECTED}")
    if len(items):
        first = items[0]
        if not (isinstance(first, tuple | list) and len(first) == 2):
            raise DataError(f"py:{location}: item 0 is {type(first).__name__}; expected {EXPECTED}")
    return items


def takes_split(function: Any) -> bool:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return "split" in parameters


def open_source(uri: SourceURI, spec: DataSpec, model: ModelSpec, cache_dir: Path) -> Dataset:
    function = load_function(uri.location)
    if takes_split(function):
        train = MapSplit(build(function, uri.location, split="train"))
        val = MapSplit(build(function, uri.location, split="val"))
        rule = "split keyword"
    else:
        items = build(function, uri.location)
        held = max(1, int(len(items) * spec.val_fraction))
        if len(items) <= held:
            raise DataError(f"py:{uri.location} returned {len(items)} items: too few for a training and a "
                            f"validation split (val_fraction={spec.val_fraction} holds out {held})")
        train, val = MapSplit(items, 0, len(items) - held), MapSplit(items, len(items) - held)
        rule = f"tail {held} items"
    return Dataset(train=train, val=val, description={"source": str(uri), "format": "py", "val_split": rule,
                                                      "train_items": len(train), "val_items": len(val)})
