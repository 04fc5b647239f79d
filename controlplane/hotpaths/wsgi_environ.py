"""Keep the server process's own environment variables out of each request's WSGI environ.

Some servers build every request's environ on a copy of `os.environ`, as CGI did (PEP 3333
allows it; granian does it): `request.META` would then hold `DATABASE_URL`, `SECRET_KEY` and
every other secret of the process, one `repr(request.META)` away from a log line or an error
report. This wrapper drops those keys before Django sees the request; the request's own keys
(CGI variables, `HTTP_*` headers, `wsgi.*`) stay."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

# Keys a server sets for the request itself, even when a variable of that name is also in the
# process environment.
_REQUEST_PREFIXES = ("HTTP_", "wsgi.", "SERVER_", "REMOTE_", "CONTENT_", "REQUEST_", "PATH_", "QUERY_", "SCRIPT_")
_REQUEST_KEYS = frozenset({"GATEWAY_INTERFACE", "HTTPS"})


def process_only_keys(env: Iterable[str]) -> frozenset[str]:
    """The process environment's keys that no request can own."""
    return frozenset(k for k in env if not k.startswith(_REQUEST_PREFIXES) and k not in _REQUEST_KEYS)


class DropProcessEnviron:
    """WSGI wrapper: removes the process environment's variables from each request's environ."""

    def __init__(self, app: Callable[..., Iterable[bytes]], env: Iterable[str] | None = None) -> None:
        self.app = app
        self.process_keys = process_only_keys(os.environ if env is None else env)

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        if not self.process_keys.isdisjoint(environ):
            environ = {k: v for k, v in environ.items() if k not in self.process_keys}
        return self.app(environ, start_response)
