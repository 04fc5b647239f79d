"""Simulated node agents for `python -m bench fleet`: many in one asyncio loop, each speaking the
agent protocol over its own two keep-alive HTTP/1.1 connections (one held long-poll, one for
heartbeats), as `agent/client.py` does with requests. What each does and sees is recorded for
the bench to reduce: heartbeat latencies and times, and every command answer (time, generation)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

COMMANDS_PATH = "/api/v1/agents/commands/"
POLL_WAIT_S = 20  # what agent/main.py asks for


class HTTPConnection:
    """One keep-alive HTTP/1.1 connection to 127.0.0.1:`port` (Content-Length or chunked answers)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, method: str, path: str, *, headers: dict[str, str], body: bytes = b"") -> tuple[int, bytes]:
        for attempt in (0, 1):  # a keep-alive connection the server closed meanwhile: reopen once
            try:
                if self.writer is None:
                    await self._open()
                lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}", f"Content-Length: {len(body)}"]
                lines += [f"{k}: {v}" for k, v in headers.items()]
                self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
                await self.writer.drain()
                return await self._response()
            except (ConnectionError, asyncio.IncompleteReadError, OSError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def _response(self) -> tuple[int, bytes]:
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionResetError("closed before the answer")
        status = int(status_line.split()[1])
        length, chunked, close = 0, False, False
        while (line := await self.reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif name == "connection" and value.lower() == "close":
                close = True
        if chunked:
            parts = []
            while (size := int((await self.reader.readline()).split(b";")[0], 16)) > 0:
                parts.append(await self.reader.readexactly(size))
                await self.reader.readline()
            await self.reader.readline()
            body = b"".join(parts)
        else:
            body = await self.reader.readexactly(length)
        if close:
            self.close()
        return status, body


@dataclass
class AgentRecord:
    instance_id: int
    job_id: int
    heartbeats: list[tuple[float, float]] = field(default_factory=list)  # (sent at, latency s)
    heartbeat_errors: int = 0
    answers: list[tuple[float, int | None]] = field(default_factory=list)  # (received at, generation)
    poll_errors: int = 0


class Fleet:
    """`agents` = [(instance id, job id, token)]; run() until stop() is called."""

    def __init__(self, port: int, agents: list[tuple[int, int, str]], *, heartbeat_s: float, seed: int = 0) -> None:
        self.port = port
        self.heartbeat_s = heartbeat_s
        self.rng = random.Random(seed)
        self.records = {iid: AgentRecord(iid, job) for iid, job, _ in agents}
        self.tokens = {iid: token for iid, _, token in agents}
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.first_answer = asyncio.Event()
        self._answered: set[int] = set()

    def poll_headers(self, iid: int) -> dict[str, str]:
        """What `agent/client.py` sends with a command poll (requests, a GET with no body): no
        Content-Type, so the poll is a plain one that the batched fast path takes, as a real
        agent's is (`controlplane.hotpaths.poll_channel.poll_claim`)."""
        return {"Authorization": f"Token {self.tokens[iid]}", "Accept": "application/json"}

    def heartbeat_headers(self, iid: int) -> dict[str, str]:
        """What it sends with a heartbeat (a JSON body)."""
        return {**self.poll_headers(iid), "Content-Type": "application/json"}

    async def _poll(self, iid: int) -> None:
        conn, record, version = HTTPConnection(self.port), self.records[iid], ""
        headers = self.poll_headers(iid)
        while not self.stopping.is_set():
            try:
                status, body = await conn.request(
                    "GET", f"{COMMANDS_PATH}?version={version}&wait={POLL_WAIT_S}", headers=headers)
            except (ConnectionError, OSError, asyncio.IncompleteReadError):
                record.poll_errors += 1
                await asyncio.sleep(0.5)
                continue
            if status != 200:
                record.poll_errors += 1
                await asyncio.sleep(0.5)
                continue
            answer = json.loads(body)
            version = answer["version"]
            record.answers.append((time.monotonic(), (answer.get("generation") or {}).get("number")))
            self._answered.add(iid)
            if len(self._answered) == len(self.records):
                self.first_answer.set()
        conn.close()

    async def _heartbeat(self, iid: int) -> None:
        conn, record = HTTPConnection(self.port), self.records[iid]
        headers = self.heartbeat_headers(iid)
        path = f"/api/v1/instances/{iid}/heartbeat/"
        # Agents start at random moments: spread the period's heartbeats evenly.
        next_at = time.monotonic() + self.rng.uniform(0, self.heartbeat_s)
        while not self.stopping.is_set():
            delay = next_at - time.monotonic()
            if delay > 0:
                try:
                    await asyncio.wait_for(self.stopping.wait(), delay)
                    break
                except TimeoutError:
                    pass
            sent = time.monotonic()
            try:
                status, _ = await conn.request("POST", path, headers=headers, body=b"{}")
            except (ConnectionError, OSError, asyncio.IncompleteReadError):
                status = 0
            if status == 200:
                record.heartbeats.append((sent, time.monotonic() - sent))
            else:
                record.heartbeat_errors += 1
            next_at += self.heartbeat_s
        conn.close()

    def start(self) -> None:
        for iid in self.records:
            self.tasks.append(asyncio.create_task(self._poll(iid)))
            self.tasks.append(asyncio.create_task(self._heartbeat(iid)))

    async def stop(self) -> None:
        self.stopping.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
