"""Billing's periodic work (thin: the work is in `market.pull` and `billing.services`)."""

from __future__ import annotations

from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
from celery import shared_task

from controlplane.billing.services import billing_reprice_open_segments
from controlplane.market.pull import spot_prices_pull

# Transient failures only: the network or the API being briefly away. Anything else (bad
# credentials, a bug) fails at once and is logged.
TRANSIENT = (BotoConnectionError, EndpointConnectionError, ReadTimeoutError, ConnectionError, TimeoutError)


# The name is its wire identity (beat's schedule carries it), kept from when the market held it.
@shared_task(
    name="market.tasks.pull_spot_prices",
    acks_late=True,
    autoretry_for=TRANSIENT,
    retry_backoff=30,
    retry_backoff_max=600,
    max_retries=5,
)
def pull_spot_prices(regions: list[str] | None = None, instance_types: list[str] | None = None) -> dict:
    """Pull recent spot prices for `regions` (default: the configured region). Safe to run twice:
    the loader ignores changes already stored."""
    results = spot_prices_pull(regions=regions, instance_types=instance_types)
    summary: dict = {r.region: {"inserted": r.counts.inserted, "already_present": r.counts.already_present,
                                "pages": r.pages} for r in results}
    if any(r.counts.inserted for r in results):
        # New prices: split the open billing segments they affect.
        summary["billing_segments_repriced"] = billing_reprice_open_segments()
    return summary
