"""`POST /api/v1/spot-prices/upload/` (issue 21, "API completeness"): a staff user loads a price
file through the same loader as `manage.py ingest_spot_prices`; a bad row writes nothing unless
`skip_bad`; the same file again inserts nothing; everyone else is refused."""

from __future__ import annotations

import gzip

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from controlplane.market.ingest import BadRow, iter_price_rows
from controlplane.market.models import SpotPrice
from tests.controlplane.api_helpers import make_team_world

pytestmark = pytest.mark.django_db
GOOD = [
    "use1-az4\tp3.2xlarge\tLinux/UNIX\t0.918000\t2022-05-31T18:20:41+00:00",
    "use1-az4\tp3.2xlarge\tLinux/UNIX\t0.950000\t2022-05-31T19:20:41+00:00",
    "apne1-az1\tg4dn.xlarge\tLinux/UNIX\t0.241000\t2022-05-31T18:21:59Z",
]
URL = "/api/v1/spot-prices/upload/"


def _file(lines, *, gz=False, name="prices.tsv"):
    data = ("\n".join(lines) + "\n").encode()
    return SimpleUploadedFile(name, gzip.compress(data) if gz else data)


@pytest.fixture
def world():
    world = make_team_world("ops")
    world.admin.is_staff = True
    world.admin.save(update_fields=["is_staff"])
    return world


@pytest.mark.parametrize("gz", [False, True])
def test_staff_load_a_file_and_loading_it_again_adds_nothing(world, gz):
    response = world.admin_client.post(URL, {"file": _file(GOOD, gz=gz)}, format="multipart")
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["filename"], data["good_rows"], data["inserted"], data["bad_row_count"]) == ("prices.tsv", 3, 3, 0)
    assert SpotPrice.objects.count() == 3
    again = world.admin_client.post(URL, {"file": _file(GOOD, gz=gz)}, format="multipart").json()
    assert (again["inserted"], again["already_present"]) == (0, 3)
    assert SpotPrice.objects.count() == 3


def test_a_bad_row_writes_nothing_unless_skip_bad(world):
    lines = [*GOOD, "use1-az4\tp3.2xlarge\tLinux/UNIX\tnot-a-price\t2022-05-31T20:00:00Z"]
    response = world.admin_client.post(URL, {"file": _file(lines)}, format="multipart")
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert "file" in errors and "line(s) 4" in errors["file"][0] and "/tmp" not in response.content.decode()
    assert SpotPrice.objects.count() == 0
    response = world.admin_client.post(URL, {"file": _file(lines), "skip_bad": "true"}, format="multipart")
    assert response.status_code == 201
    data = response.json()
    assert data["inserted"] == 3 and data["bad_rows"][0]["line"] == 4
    assert SpotPrice.objects.count() == 3


@pytest.mark.parametrize("body", [
    {},
    {"file": SimpleUploadedFile("x.tsv", b"\xff\xfe\x00bad")},
    {"file": SimpleUploadedFile("x.tsv.gz", b"\x1f\x8b\x08broken")},
])
def test_not_a_price_file_is_400_naming_file(world, body):
    response = world.admin_client.post(URL, body, format="multipart")
    assert response.status_code == 400 and "file" in response.json()["errors"]
    assert SpotPrice.objects.count() == 0


def test_too_large_is_400(world, settings):
    settings.SPOTPIPE_PRICE_UPLOAD_MAX_BYTES = 50
    response = world.admin_client.post(URL, {"file": _file(GOOD)}, format="multipart")
    assert response.status_code == 400 and "file" in response.json()["errors"]
    assert SpotPrice.objects.count() == 0


def test_only_staff_load_prices():
    plain = make_team_world("plain")
    for client in (plain.admin_client, plain.member_client, plain.agent_client):
        assert client.post(URL, {"file": _file(GOOD)}, format="multipart").status_code == 403
    assert SpotPrice.objects.count() == 0


@pytest.mark.parametrize(("line", "reason"), [
    # Times that do not fit once in UTC (OverflowError: a 500 on both databases).
    ("use1-az4\tp3.2xlarge\tLinux/UNIX\t0.9\t0001-01-01T00:00:00+05:00", "is out of range in UTC"),
    ("use1-az4\tp3.2xlarge\tLinux/UNIX\t0.9\t9999-12-31T23:00:00-05:00", "is out of range in UTC"),
    # Longer than their columns (a 500 on PostgreSQL, stored whole on SQLite): Zone.code and
    # zone_id 40, InstanceType.name 60, SpotPrice.product 40.
    ("z" * 41 + "\tp3.2xlarge\tLinux/UNIX\t0.9\t2022-05-31T20:00:00Z", "zone is 41 characters long; at most 40"),
    ("use1-az4\t" + "t" * 61 + "\tLinux/UNIX\t0.9\t2022-05-31T20:00:00Z",
     "instance type is 61 characters long; at most 60"),
    ("use1-az4\tp3.2xlarge\t" + "p" * 41 + "\t0.9\t2022-05-31T20:00:00Z", "product is 41 characters long; at most 40"),
    # What no store accepts, and control characters.
    ("use1-az4\x00\tp3.2xlarge\tLinux/UNIX\t0.9\t2022-05-31T20:00:00Z", "zone contains a NUL character"),
    ("use1-az4\tp3.2xlarge\tLinux\x00UNIX\t0.9\t2022-05-31T20:00:00Z", "product contains a NUL character"),
    ("use1-az4\tp3.2x\x1blarge\tLinux/UNIX\t0.9\t2022-05-31T20:00:00Z", "instance type 'p3.2x\\x1blarge' contains a "
                                                                          "control character"),
])
def test_rows_the_columns_cannot_hold_are_bad_rows(world, line, reason):
    lines = [*GOOD, line]
    response = world.admin_client.post(URL, {"file": _file(lines)}, format="multipart")
    assert response.status_code == 400, response.content
    assert "line(s) 4" in response.json()["errors"]["file"][0]
    assert SpotPrice.objects.count() == 0
    response = world.admin_client.post(URL, {"file": _file(lines), "skip_bad": "true"}, format="multipart")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["inserted"] == 3 and [row["line"] for row in data["bad_rows"]] == [4]
    assert reason in data["bad_rows"][0]["reason"]
    assert SpotPrice.objects.count() == 3


def test_a_lone_surrogate_in_a_cell_is_a_bad_row():
    """A file decodes strictly (an encoded surrogate is not UTF-8: 400 naming `file`), but the
    parser takes any text: a lone surrogate is refused there too (`runtime.storable`)."""
    [row] = iter_price_rows(["use1-az4\tp3.2xlarge\tLinux/UNIX\ud800\t0.9\t2022-05-31T20:00:00Z"])
    assert isinstance(row, BadRow) and row.reason.startswith("product contains a lone surrogate")


def test_an_encoded_surrogate_is_not_utf8(world):
    data = b"use1-az4\tp3.2xlarge\tLinux\xed\xa0\x80UNIX\t0.9\t2022-05-31T20:00:00Z\n"  # U+D800 encoded
    response = world.admin_client.post(URL, {"file": SimpleUploadedFile("x.tsv", data)}, format="multipart")
    assert response.status_code == 400 and "not a UTF-8" in response.json()["errors"]["file"][0]
    assert SpotPrice.objects.count() == 0
