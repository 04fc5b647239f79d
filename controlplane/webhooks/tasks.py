"""Celery tasks of the webhooks app: outbound alert delivery (thin; logic in `alerts`)."""

from __future__ import annotations

from celery import shared_task

from controlplane.webhooks import alerts


@shared_task(name="webhooks.deliver_alert", bind=True, acks_late=True, ignore_result=True,
             max_retries=alerts.MAX_ATTEMPTS - 1)
def deliver_alert(self, delivery_id: int) -> str:
    """Try one alert delivery; on a transient failure, retry after the delivery's backoff."""
    outcome = alerts.alert_deliver(delivery_id=delivery_id)
    if outcome == "retry":
        raise self.retry(countdown=alerts.backoff_s(self.request.retries + 1))
    return outcome
