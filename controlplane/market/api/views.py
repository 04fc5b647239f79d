"""Market API: the catalogue and spot prices. Market data is global: any authenticated caller
may read it (there is nothing team-owned here)."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, generics, serializers, status
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.api.access import UsersOnly
from controlplane.common.api import validate_or_400, validated_query
from controlplane.common.fields import CharField
from controlplane.common.filters import FilterBackend
from controlplane.market import selectors
from controlplane.market.api.filters import InstanceTypeFilter, ZoneFilter
from controlplane.market.api.serializers import (
    CheapestQuery,
    InstanceTypeSerializer,
    PoolSerializer,
    SpotPriceHistorySerializer,
    SpotPriceQuery,
    ZoneSerializer,
)
from controlplane.market.models import InstanceType

# Without a bucket, a history answer is capped so a chart cannot ask for millions of rows.
MAX_RAW_POINTS = 10_000


class InstanceTypeList(generics.ListAPIView):
    """Instance types with specs and on-demand price (USD/hour; null when unknown)."""

    permission_classes = [IsAuthenticated, UsersOnly]
    filter_backends = [FilterBackend]
    filterset_class = InstanceTypeFilter

    serializer_class = InstanceTypeSerializer

    def get_queryset(self):
        return selectors.instance_type_list()


class ZoneList(generics.ListAPIView):
    """Availability zones with their region and cloud."""

    permission_classes = [IsAuthenticated, UsersOnly]
    filter_backends = [FilterBackend]
    filterset_class = ZoneFilter

    serializer_class = ZoneSerializer

    def get_queryset(self):
        return selectors.zone_list()


class SpotPriceHistory(APIView):
    """Price changes of one pool, raw or downsampled by the database into time buckets."""

    permission_classes = [IsAuthenticated, UsersOnly]

    @extend_schema(parameters=[SpotPriceQuery], responses={200: SpotPriceHistorySerializer})
    def get(self, request: Request) -> Response:
        params = validated_query(SpotPriceQuery, request)
        itype = InstanceType.objects.filter(name=params["instance_type"]).order_by("id").first()
        if itype is None:
            raise exceptions.ValidationError({"instance_type": [f"no instance type named {params['instance_type']!r}"]})
        zone = selectors.zone_get(value=params["zone"])
        if zone is None:
            raise exceptions.ValidationError({"zone": [f"no zone with ID or name {params['zone']!r}"]})
        bucket = params.get("bucket")
        points = selectors.spot_price_history(
            instance_type=itype, zone=zone, start=params.get("start"), end=params.get("end"),
            bucket_seconds=bucket, product=params["product"], limit=MAX_RAW_POINTS + 1,
        )
        if len(points) > MAX_RAW_POINTS:
            raise exceptions.ValidationError({"bucket": [
                f"more than {MAX_RAW_POINTS} points in this range; narrow start/end or pass a (larger) bucket"
            ]})
        data = {"instance_type": itype.name, "zone": zone.zone_id or zone.code, "product": params["product"],
                "bucket_seconds": bucket, "points": points}
        return Response(SpotPriceHistorySerializer(data).data)


class CheapestPools(APIView):
    """The cheapest spot pools by the price in force at a moment (default now)."""

    permission_classes = [IsAuthenticated, UsersOnly]

    @extend_schema(parameters=[CheapestQuery], responses={200: PoolSerializer(many=True)})
    def get(self, request: Request) -> Response:
        params = validated_query(CheapestQuery, request)
        pools = selectors.cheapest_pools(
            at=params.get("at") or timezone.now(), instance_types=params.get("instance_type"),
            limit=params["limit"], product=params["product"], per_accelerator=params["per_accelerator"],
        )
        return Response(PoolSerializer(pools, many=True).data)


class PriceUploadSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="A price file: TSV or CSV (zone, instance type, product, price, "
                                           "timestamp), with or without header, plain or gzipped.")
    skip_bad = serializers.BooleanField(required=False, default=False,
                                        help_text="Load the good rows and report the bad ones (default: a file "
                                                  "with a bad row is not loaded at all).")


class _BadRowSerializer(serializers.Serializer):
    line = serializers.IntegerField()
    reason = CharField()


class PriceUploadResultSerializer(serializers.Serializer):
    filename = CharField()
    header = serializers.BooleanField()
    good_rows = serializers.IntegerField()
    bad_row_count = serializers.IntegerField()
    bad_rows = _BadRowSerializer(many=True, help_text="The first 100.")
    inserted = serializers.IntegerField(help_text="New price changes stored.")
    already_present = serializers.IntegerField(help_text="Rows the history already held (loading is idempotent).")


class SpotPriceUpload(APIView):
    """Load a spot price history file (staff users: the market is shared by every team). The same
    loader as `manage.py ingest_spot_prices`: validated in full first, so a file with a bad row
    writes nothing unless `skip_bad`; loading the same file again inserts nothing."""

    permission_classes = [IsAuthenticated, UsersOnly]
    parser_classes = [MultiPartParser]

    @extend_schema(request={"multipart/form-data": PriceUploadSerializer}, responses={
        201: PriceUploadResultSerializer,
        400: OpenApiResponse(description="No file, too large, not a price file, or bad rows without `skip_bad` "
                                         "(`errors.file`; nothing written)."),
        401: OpenApiResponse(description="No or a bad token."),
        403: OpenApiResponse(description="Not a staff user, or an agent token."),
    })
    def post(self, request: Request) -> Response:
        from controlplane.market.ingest import spot_prices_ingest_upload

        if not getattr(request.user, "is_staff", False):
            raise exceptions.PermissionDenied("only staff users may load prices: the market is shared by every team")
        data = validate_or_400(PriceUploadSerializer(data=request.data))
        report = spot_prices_ingest_upload(upload=data["file"], skip_bad=data["skip_bad"])
        return Response(PriceUploadResultSerializer({
            "filename": report.path, "header": report.header, "good_rows": report.good_rows,
            "bad_row_count": len(report.bad_rows),
            "bad_rows": [{"line": b.line, "reason": b.reason} for b in report.bad_rows[:100]],
            "inserted": report.counts.inserted, "already_present": report.counts.already_present,
        }).data, status=status.HTTP_201_CREATED)
