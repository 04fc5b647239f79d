"""Market API: catalogue lists, price history (raw and bucketed), cheapest pools, and 400s that
name the bad parameter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from rest_framework.test import APIClient

from controlplane.market.services import catalogue_load
from tests.controlplane.api_helpers import make_team_world
from tests.controlplane.factories import make_instance_type, make_spot_prices, make_zone

pytestmark = pytest.mark.django_db
T0 = datetime(2022, 5, 31, 12, 0, tzinfo=UTC)


@pytest.fixture
def client():
    return make_team_world().member_client


@pytest.fixture
def pool():
    itype, zone = make_instance_type("p3.2xlarge", "3.06"), make_zone()
    make_spot_prices(itype, zone, [(T0 + timedelta(minutes=k * 20), f"1.{k}") for k in range(6)])
    return itype, zone


def test_catalogue_lists(client):
    catalogue_load()
    response = client.get("/api/v1/instance-types/", {"cloud": "aws", "accelerated": "true", "page_size": 500})
    assert response.status_code == 200
    names = {row["name"] for row in response.json()["results"]}
    assert {"p3.2xlarge", "g5.12xlarge", "p4d.24xlarge"} <= names and "c5.4xlarge" not in names
    local = client.get("/api/v1/instance-types/", {"cloud": "local"}).json()["results"]
    assert [row["name"] for row in local] == ["local.node"]
    make_zone()
    zones = client.get("/api/v1/zones/", {"region": "us-east-1"}).json()["results"]
    assert [(z["code"], z["zone_id"], z["cloud"]) for z in zones] == [("us-east-1a", "use1-az4", "aws")]


def test_spot_price_history_raw_and_bucketed(client, pool):
    raw = client.get("/api/v1/spot-prices/", {"instance_type": "p3.2xlarge", "zone": "use1-az4",
                                              "start": T0.isoformat(), "end": (T0 + timedelta(hours=1)).isoformat()})
    assert raw.status_code == 200
    assert [p["price"] for p in raw.json()["points"]] == ["1.000000", "1.100000", "1.200000"]
    bucketed = client.get("/api/v1/spot-prices/", {"instance_type": "p3.2xlarge", "zone": "us-east-1a",
                                                   "bucket": 3600}).json()
    assert bucketed["bucket_seconds"] == 3600 and bucketed["zone"] == "use1-az4"
    assert [(p["count"], p["min"], p["max"]) for p in bucketed["points"]] == [
        (3, "1.000000", "1.200000"), (3, "1.300000", "1.500000")
    ]


def test_cheapest(client, pool):
    g4 = make_instance_type("g4dn.xlarge", "0.526")
    make_spot_prices(g4, pool[1], [(T0, "0.2")])
    rows = client.get("/api/v1/spot-prices/cheapest/", {"at": (T0 + timedelta(hours=3)).isoformat(),
                                                        "limit": 5}).json()
    assert [(r["instance_type"], r["price"]) for r in rows] == [("g4dn.xlarge", "0.200000"),
                                                                ("p3.2xlarge", "1.500000")]
    only = client.get("/api/v1/spot-prices/cheapest/", {"at": T0.isoformat(), "instance_type": "p3.2xlarge"}).json()
    assert [(r["instance_type"], r["since"]) for r in only] == [("p3.2xlarge", "2022-05-31T12:00:00Z")]


@pytest.mark.parametrize(
    ("url", "params", "field"),
    [
        ("/api/v1/spot-prices/", {"zone": "use1-az4"}, "instance_type"),
        ("/api/v1/spot-prices/", {"instance_type": "p3.2xlarge"}, "zone"),
        ("/api/v1/spot-prices/", {"instance_type": "nope.large", "zone": "use1-az4"}, "instance_type"),
        ("/api/v1/spot-prices/", {"instance_type": "p3.2xlarge", "zone": "mars-az1"}, "zone"),
        ("/api/v1/spot-prices/", {"instance_type": "p3.2xlarge", "zone": "use1-az4", "start": "noon"}, "start"),
        ("/api/v1/spot-prices/", {"instance_type": "p3.2xlarge", "zone": "use1-az4", "bucket": "0"}, "bucket"),
        ("/api/v1/spot-prices/", {"instance_type": "p3.2xlarge", "zone": "use1-az4", "bucket": "x"}, "bucket"),
        ("/api/v1/spot-prices/", {"instance_type": "p3.2xlarge", "zone": "use1-az4",
                                  "start": "2022-06-01T00:00:00Z", "end": "2022-05-01T00:00:00Z"}, "end"),
        ("/api/v1/spot-prices/cheapest/", {"limit": "0"}, "limit"),
        ("/api/v1/spot-prices/cheapest/", {"at": "soon"}, "at"),
        ("/api/v1/spot-prices/cheapest/", {"instance_type": " , "}, "instance_type"),
        ("/api/v1/instance-types/", {"accelerated": "maybe"}, "accelerated"),
    ],
)
def test_bad_parameters_are_400_naming_the_parameter(client, pool, url, params, field):
    response = client.get(url, params)
    assert response.status_code == 400, response.content
    body = response.json()
    assert field in body["errors"] and field in body["detail"]


def test_market_needs_authentication(pool):
    assert APIClient().get("/api/v1/instance-types/").status_code in (401, 403)
    assert APIClient().get("/api/v1/spot-prices/cheapest/").status_code in (401, 403)


def test_raw_history_too_long_asks_for_a_bucket(client, pool, monkeypatch):
    from controlplane.market.api import views

    monkeypatch.setattr(views, "MAX_RAW_POINTS", 4)
    params = {"instance_type": "p3.2xlarge", "zone": "use1-az4"}
    response = client.get("/api/v1/spot-prices/", params)
    assert response.status_code == 400 and "bucket" in response.json()["errors"]
    assert client.get("/api/v1/spot-prices/", {**params, "bucket": 3600}).status_code == 200
