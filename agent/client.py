"""HTTP client of the control plane, with retries and backoff: the agent must ride out a control
plane restart (connection refused, 502/503) without losing its place."""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import requests

logger = logging.getLogger("spotpipe.agent")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class ControlPlaneError(Exception):
    """The control plane answered with a 4xx that retrying will not fix."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class Stopped(Exception):
    """The agent is shutting down; give up retrying."""


class ControlPlaneClient:
    """Thin JSON client. Every call retries connection errors and 5xx with exponential backoff and
    jitter (`backoff_s` doubling up to `max_backoff_s`) until it succeeds or `stop` is set."""

    def __init__(self, base_url: str, *, token: str = "", stop: threading.Event | None = None,
                 timeout_s: float = 10.0, backoff_s: float = 0.1, max_backoff_s: float = 3.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.stop = stop or threading.Event()
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._local = threading.local()
        self.retries = 0
        # Held while the token is being rotated: a call refused (401) with the old token waits for
        # the rotation and retries with the new one, instead of taking the 401 as "node is done".
        self._token_lock = threading.RLock()

    def _session(self) -> requests.Session:
        # One session per thread: requests.Session is not thread-safe.
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            self._local.session = session
        return session

    def request(self, method: str, path: str, *, json: Any = None, params: dict | None = None,
                timeout_s: float | None = None, retry: bool = True, retry_on: frozenset[int] = frozenset()) -> Any:
        """Call the API; returns the decoded JSON body (None for an empty body)."""
        response = self._send(method, path, json=json, params=params, timeout_s=timeout_s, retry=retry,
                              retry_on=retry_on)
        return response.json() if response.content else None

    def download(self, path: str, folder: Path) -> Path:
        """GET a file of the API (a package) into `folder`, named as the server names it
        (Content-Disposition), checked against its `X-Checksum-SHA256`; returns its path."""
        response = self._send("GET", path, stream=True)
        disposition = response.headers.get("Content-Disposition", "")
        match = re.search(r'filename="?([A-Za-z0-9][A-Za-z0-9._+-]*)"?', disposition)
        if match is None:
            raise ControlPlaneError(response.status_code, f"{path}: no file name in the answer")
        folder.mkdir(parents=True, exist_ok=True)
        target, digest = folder / match.group(1), hashlib.sha256()
        partial = target.with_name(f".{target.name}.part")
        with partial.open("wb") as fh:
            for chunk in response.iter_content(1 << 20):
                digest.update(chunk)
                fh.write(chunk)
        expected = response.headers.get("X-Checksum-SHA256", "")
        if expected and digest.hexdigest() != expected:
            partial.unlink(missing_ok=True)
            raise ControlPlaneError(response.status_code, f"{path}: sha256 {digest.hexdigest()}, expected {expected}")
        os.replace(partial, target)
        return target

    def _send(self, method: str, path: str, *, json: Any = None, params: dict | None = None,
              timeout_s: float | None = None, retry: bool = True, retry_on: frozenset[int] = frozenset(),
              stream: bool = False) -> requests.Response:
        """One call with the retry rules above; the response of a 2xx/3xx, else ControlPlaneError."""
        url = f"{self.base_url}/api/v1/{path.lstrip('/')}"
        delay = self.backoff_s
        while True:
            if self.stop.is_set():
                raise Stopped()
            token = self.token
            headers = {"Authorization": f"Token {token}"} if token else {}
            try:
                response = self._session().request(method, url, json=json, params=params, headers=headers,
                                                   timeout=timeout_s or self.timeout_s, stream=stream)
                if response.status_code == 401 and token and self._rotated_since(token):
                    continue
                if response.status_code not in RETRY_STATUSES and response.status_code not in retry_on:
                    if response.status_code >= 400:
                        try:
                            body = response.json()
                        except ValueError:
                            body = response.text[:500]
                        raise ControlPlaneError(response.status_code, body)
                    return response
                problem = f"HTTP {response.status_code}"
            except (requests.ConnectionError, requests.Timeout) as exc:
                problem = type(exc).__name__
                self._local.session = None  # drop pooled connections to a server that went away
            if not retry:
                raise ControlPlaneError(0, problem)
            self.retries += 1
            logger.info("%s %s failed (%s); retrying in %.2fs", method, path, problem, delay)
            if self.stop.wait(delay * random.uniform(0.8, 1.2)):
                raise Stopped()
            delay = min(delay * 2, self.max_backoff_s)

    def _rotated_since(self, token: str) -> bool:
        """Whether the token changed since `token` was sent (after any rotation in flight ends)."""
        with self._token_lock:
            return self.token != token

    def rotate_token(self) -> dict:
        """Trade the live token for a new one (`POST agents/token/`); every later call uses it."""
        with self._token_lock:
            answer = self.request("POST", "agents/token/", json={})
            self.token = answer["token"]
        return answer

    # --- the protocol --------------------------------------------------------------------------------
    def enroll(self, *, enroll_key: str, provider_instance_id: str, address: str = "", identity_document: str = "",
               identity_signature: str = "") -> dict:
        # 409: the control plane has not attached this node yet; keep trying.
        return self.request("POST", "agents/enroll/", json={
            "enroll_key": enroll_key, "provider_instance_id": provider_instance_id, "agent_address": address,
            "identity_document": identity_document, "identity_signature": identity_signature,
        }, retry_on=frozenset({409}))

    def heartbeat(self, *, instance_id: int, address: str = "") -> dict:
        body = {"agent_address": address} if address else {}
        return self.request("POST", f"instances/{instance_id}/heartbeat/", json=body, timeout_s=3.0)

    def commands(self, *, version: str, wait_s: float) -> dict:
        return self.request("GET", "agents/commands/", params={"version": version, "wait": wait_s},
                            timeout_s=wait_s + 10.0)

    def notice(self, *, kind: str, action: str, deadline: str | None, cloud: str, raw: dict) -> dict:
        return self.request("POST", "agents/notices/", json={
            "kind": kind, "action": action, "deadline": deadline, "cloud": cloud, "raw": raw,
        }, timeout_s=3.0)

    def event(self, *, kind: str, generation: int | None = None, step: int | None = None,
              code: int | None = None, message: str = "", log_tail: list[str] | None = None) -> None:
        """Report what a worker did. The id is made once here and every retry of this call sends it:
        a POST whose answer was lost is sent again, and the control plane must act on it once."""
        self.request("POST", "agents/events/", json={
            "id": uuid.uuid4().hex, "kind": kind, "generation": generation, "step": step, "code": code,
            "message": message[:300],
            **({"log_tail": log_tail} if log_tail else {}),
        })

    def profile(self, *, layers: int, layer_measures: list[dict], layer_costs: list[float] | None,
                declared: dict) -> None:
        """What this (first) node measured of its job's model function; the job is planned from it."""
        self.request("POST", "agents/profile/", json={
            "layers": layers, "layer_measures": layer_measures, "layer_costs": layer_costs, "declared": declared,
        })

    def prepare_claim(self) -> dict:
        """The share of its job's prepare step this node prepares next (`state`: assigned, waiting,
        prepared or stopped)."""
        return self.request("POST", "agents/prepare/claim/", json={})

    def prepare_done(self, *, share: int, of: int, index_written: bool, files: int, input_bytes: int,
                     seconds: float) -> None:
        """This node prepared `share` of `of` (`index_written`: it wrote the corpus' index)."""
        self.request("POST", "agents/prepare/done/", json={
            "share": share, "of": of, "index_written": index_written, "files": files, "input_bytes": input_bytes,
            "seconds": seconds,
        })

    def metrics(self, *, job_id: int, samples: list[dict]) -> dict:
        return self.request("POST", f"jobs/{job_id}/metrics/", json={"samples": samples})
