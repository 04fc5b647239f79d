"""Python packages for jobs' `requirements`: a team's users upload a wheel/sdist (`POST
/packages/`, multipart `file`), and its nodes' agents (and its users) download it by sha256."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import FileResponse, Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.api.access import AgentActionsOnly, TeamScopedViewSetMixin, resolve_team
from controlplane.accounts.models import ApiToken
from controlplane.common.api import validate_or_400
from controlplane.common.fields import CharField
from controlplane.jobs import packages
from controlplane.jobs.models import Package


class PackageUploadSerializer(serializers.Serializer):
    team = serializers.IntegerField(required=False, allow_null=True, default=None)
    file = serializers.FileField(allow_empty_file=True, help_text="A wheel (.whl) or sdist (.tar.gz, .zip).")


class PackageSerializer(serializers.Serializer):
    sha256 = CharField()
    requirement = CharField(help_text="What to put in config.requirements: upload:<sha256>.")
    size = serializers.IntegerField()
    filename = CharField()


class PackageViewSet(TeamScopedViewSetMixin, viewsets.GenericViewSet):
    """Package files of the requester's teams, by sha256."""

    permission_classes = [IsAuthenticated, AgentActionsOnly]
    serializer_class = PackageSerializer
    parser_classes = [MultiPartParser]
    lookup_field = "sha256"
    lookup_value_regex = "[0-9a-f]{64}"
    # An agent downloads its job's packages: any package of its team (a job's requirements are the team's).
    agent_actions = frozenset({"retrieve"})

    def scoped_queryset(self, team_ids: list[int]) -> QuerySet:
        return Package.objects.all()

    def agent_scope(self, queryset: QuerySet, token: ApiToken) -> QuerySet:
        return queryset

    @extend_schema(request={"multipart/form-data": PackageUploadSerializer},
                   responses={201: PackageSerializer, 200: PackageSerializer})
    def create(self, request: Request) -> Response:
        """Store a package file (201; the same bytes again: 200 with the same answer)."""
        length = str(request.META.get("CONTENT_LENGTH") or "")
        packages.check_request_size(int(length) if length.isdigit() else 0)  # else: the file's size, once read
        data = validate_or_400(PackageUploadSerializer(data=request.data))
        team = resolve_team(request, data["team"])
        package, created = packages.package_store(team=team, user=request.user, upload=data["file"])
        return Response(PackageSerializer(packages.package_summary(package)).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY),
                              404: OpenApiResponse(description="No such package among the token's team's.")})
    def retrieve(self, request: Request, sha256: str = "") -> FileResponse:
        """The package file, streamed, named as uploaded (pip reads a wheel's tags from its name)."""
        package = self.get_queryset().filter(sha256=sha256).order_by("pk").first()
        if package is None:
            raise Http404(f"no package {sha256}")
        response = FileResponse(packages.package_open(package=package), as_attachment=True,
                                filename=package.filename, content_type="application/octet-stream")
        response["Content-Length"] = str(package.size)
        response["X-Checksum-SHA256"] = package.sha256
        return response
