"""`python manage.py load_catalogue`: load the bundled instance-type catalogue (idempotent)."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from controlplane.market.services import catalogue_load


class Command(BaseCommand):
    help = "Load the bundled instance-type catalogue (AWS training types and the local node type)."

    def handle(self, *args, **options) -> None:
        counts = catalogue_load()
        self.stdout.write(
            f"instance types: {counts.created} created, {counts.updated} updated, {counts.unchanged} unchanged"
        )
