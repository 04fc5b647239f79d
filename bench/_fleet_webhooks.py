"""The webhook load of `python -m bench fleet`, in a process of its own (so the simulated agents'
event loop and this client's threads do not share one GIL): the webhook bench's closed-loop burst
(bench/webhooks.py: EventBridge notices, 20% duplicates, one connection per request) against the
server on `--port`; prints the burst's figures as one JSON line."""

from __future__ import annotations

import argparse
import json

from bench.webhooks import _burst, _request, _stream


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--time-cap-s", type=float, default=120.0)
    parser.add_argument("--targets", type=int, required=True, help="instances seeded by bench.webhooks._seed")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ids = [f"i-{n:017x}" for n in range(args.targets)]  # bench.webhooks._seed's ids
    stream, _ = _stream(args.requests, ids, args.seed)
    requests = [_request(args.port, json.dumps(event).encode()) for event in stream]
    result = _burst(args.port, requests, args.connections, args.time_cap_s)
    result.pop("taken", None)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
