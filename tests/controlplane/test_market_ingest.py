"""Spot price files: the full reference file, CSV/TSV, header or not, gzipped or not, bad rows."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command

from controlplane.market.ingest import PriceFileRejected, spot_prices_ingest_file
from controlplane.market.models import InstanceType, Region, SpotPool, SpotPrice, Zone
from controlplane.market.services import catalogue_load
from tests.controlplane.factories import make_price_file, make_zone

pytestmark = pytest.mark.django_db
GOOD_TSV = [
    "use1-az4\tp3.2xlarge\tLinux/UNIX\t0.918000\t2022-05-31T18:20:41+00:00",
    "use1-az4\tp3.2xlarge\tLinux/UNIX\t0.950000\t2022-05-31T19:20:41+00:00",
    "apne1-az1\tg4dn.xlarge\tLinux/UNIX\t0.241000\t2022-05-31T18:21:59Z",
    "euw1-az2\tx9.hypothetical\tSUSE Linux\t1.5\t2022-05-31T20:00:00+00:00",
]


def test_full_reference_file_loads_once(shared_data, capsys):
    """The whole reference file (33,362 rows), then a second run that adds nothing."""
    path = shared_data / "prices" / "aws-spot-prices-2022-05.tsv.gz"
    catalogue_load()
    call_command("ingest_spot_prices", str(path))
    first = capsys.readouterr()
    assert SpotPrice.objects.count() == 33_362
    assert "33,362 inserted, 0 already present" in first.out
    assert "rows/s" in first.err  # progress on stderr
    # Every zone-ID prefix of the file maps to a named region (none left as a bare prefix).
    assert not Region.objects.filter(cloud__code="aws", code__regex=r"^[a-z]+[0-9]+$").exists()
    assert Zone.objects.filter(zone_id__startswith="use1-", region__code="us-east-1").count() >= 5
    assert InstanceType.objects.filter(cloud__code="aws").count() >= 509
    assert InstanceType.objects.get(name="p3.2xlarge").on_demand_price == Decimal("3.06")  # catalogue kept

    # One pool row per (type, zone, product), holding the newest change.
    with gzip.open(path, "rt") as handle:
        newest: dict[tuple[str, str, str], str] = {}
        for line in handle:
            zone_id, itype, product, _, ts = line.rstrip("\n").split("\t")
            newest[(zone_id, itype, product)] = max(newest.get((zone_id, itype, product), ""), ts)
    assert SpotPool.objects.count() == len(newest)
    pool = SpotPool.objects.select_related("zone", "instance_type").order_by("id").first()
    key = (pool.zone.zone_id, pool.instance_type.name, pool.product)
    assert pool.latest_timestamp == datetime.fromisoformat(newest[key])

    call_command("ingest_spot_prices", str(path))
    assert "0 inserted, 33,362 already present" in capsys.readouterr().out
    assert SpotPrice.objects.count() == 33_362
    assert SpotPool.objects.count() == len(newest)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("header", [False, True])
def test_csv_and_tsv_with_or_without_header_and_gzip(tmp_path, gz, header):
    make_zone("us-east-1a", "use1-az4")  # an existing zone known by name and ID is reused
    csv_lines = [line.replace("\t", ",") for line in GOOD_TSV]
    if header:
        # A header may order columns differently; they are found by name.
        csv_lines = ["Timestamp,SpotPrice,InstanceType,AvailabilityZoneId,ProductDescription"] + [
            ",".join([c[4], c[3], c[1], c[0], c[2]]) for c in (line.split(",") for line in csv_lines)
        ]
    path = make_price_file(tmp_path / ("prices.csv.gz" if gz else "prices.csv"), csv_lines, gz=gz)

    report = spot_prices_ingest_file(path=path)

    assert report.header is header
    assert (report.counts.inserted, report.counts.already_present, report.bad_rows) == (4, 0, [])
    row = SpotPrice.objects.get(zone__zone_id="use1-az4", timestamp=datetime(2022, 5, 31, 19, 20, 41, tzinfo=UTC))
    assert row.price == Decimal("0.95") and row.zone.code == "us-east-1a"
    assert Zone.objects.get(zone_id="apne1-az1").region.code == "ap-northeast-1"
    unknown = InstanceType.objects.get(name="x9.hypothetical")
    assert unknown.on_demand_price is None and unknown.cloud.code == "aws"
    assert spot_prices_ingest_file(path=path).counts.already_present == 4


def test_pool_keeps_the_newest_change_whatever_the_load_order(tmp_path):
    newer = make_price_file(tmp_path / "newer.tsv", [GOOD_TSV[1]])
    older = make_price_file(tmp_path / "older.tsv", [GOOD_TSV[0]])
    spot_prices_ingest_file(path=newer)
    spot_prices_ingest_file(path=older)
    pool = SpotPool.objects.get(zone__zone_id="use1-az4", instance_type__name="p3.2xlarge")
    newest = datetime(2022, 5, 31, 19, 20, 41, tzinfo=UTC)
    assert (pool.latest_price, pool.latest_timestamp) == (Decimal("0.95"), newest)
    assert SpotPrice.objects.count() == 2


def test_gzipped_tsv_is_recognised_by_content(tmp_path):
    path = make_price_file(tmp_path / "prices.dat", GOOD_TSV, gz=True)
    assert spot_prices_ingest_file(path=path).counts.inserted == 4


BAD_FILE = [
    GOOD_TSV[0],
    "use1-az4\tp3.2xlarge\tLinux/UNIX\t0.9",                                  # line 2: 4 columns
    "use1-az4\tp3.2xlarge\tLinux/UNIX\tcheap\t2022-05-31T19:00:00+00:00",     # line 3: bad price
    GOOD_TSV[1],
    "use1-az4\tp3.2xlarge\tLinux/UNIX\t0.9\tyesterday",                       # line 5: bad timestamp
    "",                                                                       # line 6: blank, ignored
    "use1-az4\tp3.2xlarge\tLinux/UNIX\t-0.5\t2022-05-31T21:00:00+00:00",      # line 7: negative
    GOOD_TSV[2],
]


def test_file_with_bad_rows_is_rejected_whole_with_line_numbers(tmp_path, capsys):
    path = make_price_file(tmp_path / "bad.tsv", BAD_FILE)
    with pytest.raises(PriceFileRejected) as caught:
        spot_prices_ingest_file(path=path)
    assert [(b.line, b.reason.split()[0]) for b in caught.value.report.bad_rows] == [
        (2, "expected"), (3, "price"), (5, "timestamp"), (7, "price")
    ]
    assert "negative" in caught.value.report.bad_rows[-1].reason
    assert SpotPrice.objects.count() == 0

    with pytest.raises(CommandError, match="rejected"):
        call_command("ingest_spot_prices", str(path))
    err = capsys.readouterr().err
    for line in (2, 3, 5, 7):
        assert f"line {line}:" in err
    assert SpotPrice.objects.count() == 0


def test_skip_bad_loads_only_the_good_rows(tmp_path, capsys):
    path = make_price_file(tmp_path / "bad.tsv", BAD_FILE)
    call_command("ingest_spot_prices", str(path), "--skip-bad")
    out, err = capsys.readouterr()
    assert "3 inserted" in out and "4 bad skipped" in out
    assert "skipped line 3" in err
    assert SpotPrice.objects.count() == 3
    assert set(SpotPrice.objects.values_list("price", flat=True)) == {
        Decimal("0.918"), Decimal("0.95"), Decimal("0.241")
    }


def test_catalogue_load_is_idempotent():
    first = catalogue_load()
    second = catalogue_load()
    assert first.created >= 12 and second.created == 0 and second.updated == 0
    node = InstanceType.objects.get(name="local.node")
    assert node.cloud.code == "local" and node.on_demand_price == 0
    p4d = InstanceType.objects.get(name="p4d.24xlarge")
    assert (p4d.accelerator_name, p4d.accelerator_count, p4d.vcpus) == ("A100", 8, 96)
    call_command("load_catalogue")
    assert InstanceType.objects.count() == first.created


def test_rebuild_pools_after_writes_that_bypassed_the_loader(capsys):
    itype, zone = InstanceType.objects.create(cloud=catalogue_cloud(), name="p3.2xlarge"), make_zone()
    SpotPrice.objects.create(instance_type=itype, zone=zone, price=Decimal("1.0"),
                             timestamp=datetime(2022, 5, 31, 1, tzinfo=UTC))
    SpotPrice.objects.create(instance_type=itype, zone=zone, price=Decimal("2.0"),
                             timestamp=datetime(2022, 5, 31, 2, tzinfo=UTC))
    assert not SpotPool.objects.exists()
    call_command("ingest_spot_prices", "--rebuild-pools")
    assert "pools rebuilt: 1" in capsys.readouterr().out
    assert SpotPool.objects.get().latest_price == Decimal("2.0")
    with pytest.raises(CommandError, match="at least one"):
        call_command("ingest_spot_prices")


def catalogue_cloud():
    from controlplane.market.services import cloud_ensure

    return cloud_ensure(code="aws")
