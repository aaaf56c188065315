"""The live claims of this process: a Redis record has no primary key, so a claim's ``pk`` (its
handle) is a number of this process, mapped to its record's key, scope and key hash until a
final write (the result, the unlock, the release) spends it, whatever its outcome."""

from __future__ import annotations

import itertools
import threading


class Handles:
    """The handles of the store's live claims in this process."""

    def __init__(self) -> None:
        #: The records of this process's live claims: pk -> (Redis key, scope, key hash).
        self.records: dict[int, tuple[str, str, str]] = {}
        #: The operation ids of those records (:mod:`.operations`), and the pks whose id was
        #: handed out (its index written: written again when the record's expiry moves).
        self.oids: dict[int, str] = {}
        self.named: set[int] = set()
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()

    def new(self, key: str, scope: str, key_hash: str, oid: str | None) -> int:
        """The handle of a claim just made on record ``key`` (``oid``: its operation id,
        ``None`` on a record of an older version, which has none)."""
        with self._lock:
            pk = next(self._numbers)
        self.records[pk] = (key, scope, key_hash)
        if oid is not None:
            self.oids[pk] = oid
        return pk

    def key(self, pk: int) -> str:
        """The Redis key of a live claim's record."""
        return self.records[pk][0]

    def forget(self, pk: int) -> None:
        """The claim's writes are over: its record is no longer this process's."""
        self.records.pop(pk, None)
        self.oids.pop(pk, None)
        self.named.discard(pk)
