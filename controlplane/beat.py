"""Periodic tasks (django-celery-beat syncs this table into its database schedule).

One entry per periodic task; each app adds its own line here."""

from __future__ import annotations

BEAT_SCHEDULE: dict[str, dict] = {}
