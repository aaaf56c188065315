"""Operations: what operators run on the records, and the app's system checks.

Owns the operators' actions (:mod:`.maintenance`: release, mark failed, stats, and the batch
loop that deletes expired records and erases a scope), erasure of a
scope (:mod:`.erasure`), a Redis store's records paged for the admin (:mod:`.browsing`) and
the system checks (:mod:`.checks`). Used by the admin and the
management commands; may import every layer below the public modules.
"""
