"""Signals sent by the app, all with ``sender=IdempotencyKey``.

Every signal gets ``request`` (the ``HttpRequest``), ``scope`` and ``key_hash``; those about a
claim also get ``claim`` (the :class:`~django_idempotency.Claim`).
"""

from __future__ import annotations

from django.dispatch import Signal

__all__ = [
    "fingerprint_mismatch",
    "key_claimed",
    "key_released",
    "key_taken_over",
    "late_result_refused",
    "lock_lost",
    "request_in_progress",
    "response_replayed",
]

#: A key was claimed for its first attempt (``claim``).
key_claimed = Signal()
#: A stale ``processing`` record was taken over by a retry (``claim``; ``claim.attempt`` > 1).
key_taken_over = Signal()
#: A stored response was replayed (``record``).
response_replayed = Signal()
#: A retry found its key still in flight and got ``409`` (``record``).
request_in_progress = Signal()
#: A retry's fingerprint differed from the stored one (``record``).
fingerprint_mismatch = Signal()
#: An attempt ended retryably (exception, 5xx, 429, 408) and its record was deleted
#: (``claim``, ``reason``).
key_released = Signal()
#: An attempt that lost its lock finished late; its result was not stored (``claim``, and
#: ``response``: the refused :class:`~django_idempotency._http.responses.StoredResponse`).
late_result_refused = Signal()
#: Lock renewal found the attempt's record no longer its own while it ran: taken over after
#: its lock expired (the process was frozen, or the database unreachable, for longer than
#: ``lock_timeout``) or released by an operator (``claim``). Sent from the renewer's thread;
#: the attempt's recovery points and derived keys raise ``LockLost`` from then on.
lock_lost = Signal()
