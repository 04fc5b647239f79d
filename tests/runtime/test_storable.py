"""runtime.storable: the one rule for text any store accepts (no NUL, no lone surrogate) and how
deep a stored JSON value may nest."""

from __future__ import annotations

import json

from runtime.storable import MAX_JSON_DEPTH, unstorable, unstorable_path


def test_text_with_a_nul_or_a_lone_surrogate_is_unstorable():
    assert unstorable("plain") is None and unstorable("naïve 日本 🙂") is None
    assert unstorable("a\x00b") == "a NUL character"
    assert "lone surrogate" in unstorable(json.loads('"a\\ud800b"'))
    assert "lone surrogate" in unstorable("\udfff")


def test_the_path_names_the_first_offender_in_strings_keys_and_lists():
    assert unstorable_path({"a": [1, "x", {"b": "ok"}]}, "body") is None
    assert unstorable_path({"a": [1, "x\x00"]}, "body") == ("a[1]", "a NUL character")
    assert unstorable_path({"a": {"b\ud800": 1}}, "body") == ("a key of a", unstorable("\ud800"))
    assert unstorable_path("\x00", "body") == ("body", "a NUL character")


def test_nesting_deeper_than_the_limit_is_named_without_recursion():
    at_limit = json.loads("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    assert unstorable_path(at_limit, "body") is None
    assert unstorable_path([at_limit], "body") is not None
    deep = json.loads('{"a":' * 900 + "1" + "}" * 900)  # checked iteratively: no RecursionError
    where, what = unstorable_path(deep, "body")
    assert where.startswith("a.a.a") and f"more than {MAX_JSON_DEPTH} levels" in what
