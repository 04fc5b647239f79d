"""The largest request body the web server reads at all: the largest any route accepts (a price
file or a package upload, each with its own tunable), plus room for the multipart framing. Each
route still checks its own, smaller limit (webhooks 1 MiB, packages and price files theirs); this
ceiling only keeps a client from making the server spool an unbounded body before any view runs."""

from __future__ import annotations

from controlplane.jobs.packages import package_max_bytes
from controlplane.market.ingest import price_upload_max_bytes

MULTIPART_FRAMING_BYTES = 1024 * 1024


def request_body_ceiling() -> int:
    return max(package_max_bytes(), price_upload_max_bytes()) + MULTIPART_FRAMING_BYTES
