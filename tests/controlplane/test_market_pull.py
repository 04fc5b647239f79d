"""Live spot prices through boto3's paginator against moto in server mode.

moto answers `describe_spot_price_history` with one fixed row per offering and no paging, so the
test teaches the moto server (which runs in this process, in a thread) to serve real rows from the
reference price file, newest first, honouring InstanceTypes, ProductDescriptions, StartTime,
MaxResults and NextToken as EC2 does. Our code only sees HTTP answers from the server."""

from __future__ import annotations

import gzip
import socket
from collections.abc import Iterator
from datetime import UTC, datetime

import boto3
import pytest
from moto.core.responses import ActionResult
from moto.ec2.responses.spot_instances import SpotInstances
from moto.server import ThreadedMotoServer

from controlplane.beat import BEAT_SCHEDULE  # noqa: F401  (the module must import cleanly)
from controlplane.billing.tasks import pull_spot_prices
from controlplane.market.models import SpotPrice, Zone
from controlplane.market.pull import FIRST_PULL_LOOKBACK, spot_prices_pull_region
from controlplane.market.services import catalogue_load

pytestmark = pytest.mark.django_db
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def moto_endpoint(monkeypatch, settings) -> Iterator[str]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(name, value)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    settings.SPOTPIPE_AWS_ENDPOINT_URL = endpoint
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def served_history(shared_data, moto_endpoint, monkeypatch) -> list[dict]:
    """Real us-east-1 Linux rows (every instance type), with zone IDs turned into this (moto) account's zone
    names, served by the moto server with EC2's paging."""
    client = boto3.client("ec2", region_name=REGION, endpoint_url=moto_endpoint)
    name_by_id = {z["ZoneId"]: z["ZoneName"] for z in client.describe_availability_zones()["AvailabilityZones"]}
    rows = []
    with gzip.open(shared_data / "prices" / "aws-spot-prices-2022-05.tsv.gz", "rt") as handle:
        for line in handle:
            zone_id, itype, product, price, ts = line.rstrip("\n").split("\t")
            if zone_id in name_by_id and product == "Linux/UNIX":
                rows.append({"AvailabilityZone": name_by_id[zone_id], "InstanceType": itype,
                             "ProductDescription": product, "SpotPrice": price,
                             "Timestamp": datetime.fromisoformat(ts)})
    rows.sort(key=lambda r: r["Timestamp"], reverse=True)  # EC2 answers newest first

    def describe_spot_price_history(self) -> ActionResult:
        types = self._get_param("InstanceTypes", [])
        products = self._get_param("ProductDescriptions", [])
        start = self._get_param("StartTime")
        max_results = int(self._get_param("MaxResults") or 1000)
        offset = int(self._get_param("NextToken") or 0)
        start_dt = datetime.fromisoformat(start.replace("Z", "+00:00")) if isinstance(start, str) else start
        if start_dt and start_dt.tzinfo is None:
            start_dt = start_dt.replace(tzinfo=UTC)
        matching = [r for r in rows if (not types or r["InstanceType"] in types)
                    and (not products or r["ProductDescription"] in products)
                    and (start_dt is None or r["Timestamp"] >= start_dt)]
        page = matching[offset : offset + max_results]
        result = {"SpotPriceHistory": [{**r, "Timestamp": r["Timestamp"].isoformat()} for r in page]}
        if offset + max_results < len(matching):
            result["NextToken"] = str(offset + max_results)
        return ActionResult(result)

    monkeypatch.setattr(SpotInstances, "describe_spot_price_history", describe_spot_price_history)
    return rows


def test_pull_pages_stores_every_change_and_second_pull_adds_nothing(served_history):
    assert len(served_history) > 200, "the reference file should have enough us-east-1 rows for paging"
    types = sorted({r["InstanceType"] for r in served_history})
    catalogue_load()
    now = datetime(2022, 6, 1, tzinfo=UTC)

    result = spot_prices_pull_region(region=REGION, instance_types=types, page_size=100, now=now)

    assert result.start == now - FIRST_PULL_LOOKBACK  # nothing stored yet
    assert result.pages == -(-len(served_history) // 100)  # ceil: every page was fetched
    assert result.counts.inserted == len(served_history)
    stored = SpotPrice.objects.filter(zone__region__code=REGION, product="Linux/UNIX")
    assert stored.count() == len(served_history)
    # Stored under the global zone IDs (the account's zone names were mapped through the API).
    assert set(stored.values_list("zone__zone_id", flat=True)) <= set(
        Zone.objects.filter(region__code=REGION).values_list("zone_id", flat=True)
    )
    assert all(z.startswith("use1-az") for z in stored.values_list("zone__zone_id", flat=True))
    # The account's zone names were recorded on the zones known by ID.
    assert all(code.startswith("us-east-1") for code in stored.values_list("zone__code", flat=True))
    newest = max(r["Timestamp"] for r in served_history)

    second = spot_prices_pull_region(region=REGION, instance_types=types, page_size=100, now=now)

    assert second.start == newest  # started at the newest stored change
    assert second.counts.inserted == 0
    assert second.counts.already_present >= 1
    assert stored.count() == len(served_history)


def test_task_pulls_through_the_same_service(served_history, settings):
    catalogue_load()
    settings.SPOTPIPE_AWS_REGION = REGION
    summary = pull_spot_prices.apply(kwargs={"instance_types": ["p3.2xlarge", "g4dn.xlarge"]}).get()
    # First pull starts one day before now: the 2022 rows are older, so nothing is new.
    assert summary[REGION]["inserted"] == 0
    assert summary[REGION]["pages"] == 1
