"""Domain errors raised by services; the API layer turns them into 4xx answers."""

from __future__ import annotations


class DomainError(Exception):
    """A request that breaks a business rule. `field` names the offending input when there is one."""

    status_code = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class Conflict(DomainError):
    """The request is valid but the object's current state forbids it."""

    status_code = 409
