"""Enrol every node of a launched acquisition through the API, as their agents would."""

from __future__ import annotations

from rest_framework.test import APIClient

from controlplane.fleet.models import Instance
from controlplane.orchestration import services


def enrol_every_node(job, acquisition) -> list[APIClient]:
    """One API client per node of `job` (by instance id), each enrolled with the acquisition's key
    and holding its agent token."""
    key = services.acquisition_enroll_key(acquisition=acquisition)
    clients = []
    for instance in Instance.objects.filter(job=job).order_by("id"):
        client = APIClient()
        answer = client.post("/api/v1/agents/enroll/", {"enroll_key": key,
                                                          "provider_instance_id": instance.provider_instance_id},
                             format="json").json()
        client.credentials(HTTP_AUTHORIZATION=f"Token {answer['token']}")
        clients.append(client)
    return clients
