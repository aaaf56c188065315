"""The HTTP-free core of one attempt: it knows a key, a scope and a fingerprint, never a request.

Owns the lifecycle of a protected call (:mod:`.lifecycle`), the claim loop (:mod:`.claiming`:
claim, wait, take over; atomic mode's transaction), the writes at its end (:mod:`.writing`: the
result, the release), the fence every owner's write goes through (:mod:`.fencing`: tried again
while the lock holds), the report of each outcome (:mod:`.reports`: logged, signalled,
counted), lock renewal (:mod:`.heartbeat`), what a call claims as (:mod:`.identity`), the claim
a view sees and its recovery points (:mod:`.claim`), the marks of ``no_store()`` and
``store_for()`` (:mod:`.storing`), a record's operation id and status URL (:mod:`.operations`),
and telemetry (:mod:`.telemetry`). May import :mod:`.._store`, :mod:`.._conf`, :mod:`.._base`
and the model.
"""
