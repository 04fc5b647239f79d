"""Celery tasks of the webhooks app: outbound alert delivery (thin; logic in `alerts`)."""

from __future__ import annotations

import logging

from celery import shared_task

from controlplane.webhooks import alerts

logger = logging.getLogger(__name__)


@shared_task(name="webhooks.deliver_alert", bind=True, acks_late=True, ignore_result=True,
             max_retries=alerts.MAX_ATTEMPTS - 1)
def deliver_alert(self, delivery_id: int) -> str:
    """Try one alert delivery; on a transient failure, retry after the delivery's backoff."""
    outcome = alerts.alert_deliver(delivery_id=delivery_id)
    if outcome == "retry":
        raise self.retry(countdown=alerts.backoff_s(self.request.retries + 1))
    return outcome


@shared_task(name="webhooks.sweep_alerts", acks_late=True, ignore_result=True)
def sweep_alerts() -> int:
    """Periodic: enqueue again the alert deliveries whose task was lost (broker down, worker died)."""
    ids = alerts.alerts_sweep()
    for delivery_id in ids:
        deliver_alert.delay(delivery_id)
    if ids:
        logger.info("alert sweep re-enqueued %d deliveries", len(ids))
    return len(ids)
