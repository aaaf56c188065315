"""The idempotency policy of protected ninja operations, in ninja's OpenAPI schema."""

from __future__ import annotations

from ninja.operation import Operation


def publish(operation: Operation) -> None:
    """Publish the policy of ``operation`` in the schemas ninja generates."""
