"""A small client of the control plane's REST API, for `spotpipe submit/jobs/status/logs/cancel/pull`.

Where it connects, like the AWS CLI: `SPOTPIPE_URL` and `SPOTPIPE_TOKEN` in the environment, else
the `url` and `token` of the profile (`SPOTPIPE_PROFILE`, default `default`) in the credentials
file (`SPOTPIPE_CONFIG`, default `~/.config/spotpipe/credentials.toml`):

    [default]
    url = "https://spotpipe.example.com"
    token = "..."

The token is an API token (the dashboard's team page or `POST /api/v1/tokens/`); it is sent only in
the Authorization header and never printed.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

DEFAULT_CONFIG = Path("~/.config/spotpipe/credentials.toml")
TIMEOUT_S = 30.0
"""Seconds to connect, and between two bytes of an answer."""
DOWNLOAD_CHUNK = 1 << 20


def _unreachable(url: str, exc: requests.RequestException) -> ClientError:
    """A slow server is said to be slow, an unreachable one unreachable."""
    if isinstance(exc, requests.ReadTimeout):
        return ClientError(f"{url} did not answer within {TIMEOUT_S:g} s (the control plane is slow or busy); "
                           "try again")
    return ClientError(f"cannot reach {url}: {exc}")


class ClientError(RuntimeError):
    """The control plane could not be reached or refused the request. `errors` holds the API's
    per-field messages (`{"config.model.n_head": ["..."]}`) when it sent them."""

    def __init__(self, message: str, *, status: int | None = None, errors: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.status = status
        self.errors = errors or {}


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str
    token: str


def endpoint_from_environment(environ: dict[str, str] | None = None) -> Endpoint:
    """The control plane to talk to (environment first, then the credentials file's profile)."""
    environ = dict(os.environ if environ is None else environ)
    url, token = environ.get("SPOTPIPE_URL", ""), environ.get("SPOTPIPE_TOKEN", "")
    if not (url and token):
        path = Path(environ.get("SPOTPIPE_CONFIG", str(DEFAULT_CONFIG))).expanduser()
        profile = environ.get("SPOTPIPE_PROFILE", "default")
        if path.is_file():
            try:
                section = tomllib.loads(path.read_text(encoding="utf-8")).get(profile) or {}
            except tomllib.TOMLDecodeError as exc:
                raise ClientError(f"{path}: not a TOML file: {exc}") from exc
            url, token = url or str(section.get("url", "")), token or str(section.get("token", ""))
    if not url or not token:
        raise ClientError("no control plane configured: set SPOTPIPE_URL and SPOTPIPE_TOKEN, or write url and "
                          f"token under [default] in {DEFAULT_CONFIG}")
    return Endpoint(url=url.rstrip("/"), token=token)


class Client:
    """Calls `/api/v1/...` with the token; raises `ClientError` with the API's message on a 4xx/5xx."""

    def __init__(self, endpoint: Endpoint, *, session: requests.Session | None = None) -> None:
        self.endpoint = endpoint
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"Token {endpoint.token}"

    def call(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        url = f"{self.endpoint.url}/api/v1/{path.lstrip('/')}"
        try:
            response = self.session.request(method, url, json=json, params=params, timeout=TIMEOUT_S)
        except requests.RequestException as exc:
            raise _unreachable(self.endpoint.url, exc) from exc
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = {}
            detail = body.get("detail") if isinstance(body, dict) else None
            errors = body.get("errors") if isinstance(body, dict) else None
            raise ClientError(f"{response.status_code}: {detail or response.reason}", status=response.status_code,
                              errors=errors if isinstance(errors, dict) else None)
        return response.json() if response.content else None

    def artifacts(self, job_id: int) -> dict[str, Any]:
        """The job's weight files: `{location, complete, files: [{name, size, sha256, url}]}`."""
        return self.call("GET", f"jobs/{job_id}/artifacts/")

    def download(self, job_id: int, name: str, dest: Path, *, size: int, sha256: str) -> None:
        """Stream artifact `name` of the job into `dest`: into a temporary file beside it, renamed
        only when its size and sha256 are the listing's (a broken download never looks whole)."""
        url = f"{self.endpoint.url}/api/v1/jobs/{job_id}/artifacts/{quote(name)}"
        part = dest.with_name(f".{dest.name}.part")
        digest, got = hashlib.sha256(), 0
        try:
            with self.session.get(url, stream=True, timeout=TIMEOUT_S) as response:
                if response.status_code >= 400:
                    raise ClientError(f"{response.status_code}: downloading {name}", status=response.status_code)
                with part.open("wb") as fh:
                    for chunk in response.iter_content(DOWNLOAD_CHUNK):
                        fh.write(chunk)
                        digest.update(chunk)
                        got += len(chunk)
        except requests.RequestException as exc:
            part.unlink(missing_ok=True)
            raise _unreachable(self.endpoint.url, exc) from exc
        if got != size or digest.hexdigest() != sha256:
            part.unlink(missing_ok=True)
            raise ClientError(f"{name}: received {got} bytes with sha256 {digest.hexdigest()}, but the listing says "
                              f"{size} bytes with sha256 {sha256}; not saved (run the command again)")
        os.replace(part, dest)

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.call("POST", "jobs/", json=body)

    def jobs(self) -> list[dict[str, Any]]:
        return self.call("GET", "jobs/", params={"page_size": 100})["results"]

    def job(self, job_id: int) -> dict[str, Any]:
        return self.call("GET", f"jobs/{job_id}/")

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self.call("POST", f"jobs/{job_id}/cancel/")

    def resume(self, job_id: int, *, budget_usd: str | None = None) -> dict[str, Any]:
        return self.call("POST", f"jobs/{job_id}/resume/", json={"budget_usd": budget_usd} if budget_usd else None)

    def events(self, job_id: int, *, since: str | None = None) -> list[dict[str, Any]]:
        """The job's timeline (every page), oldest first; from `since` (an ISO time) on."""
        params: dict[str, Any] = {"page_size": 500, "page": 1}
        if since:
            params["since"] = since
        out: list[dict[str, Any]] = []
        while True:
            page = self.call("GET", f"jobs/{job_id}/events/", params=params)
            out += page["results"]
            if not page.get("next"):
                return out
            params["page"] += 1
