"""Operations: what operators run on the records, and the app's system checks.

Owns the operators' actions (:mod:`.maintenance`: release, mark failed, stats), erasure of a
scope (:mod:`.erasure`) and the system checks (:mod:`.checks`). Used by the admin and the
management commands; may import every layer below the public modules.
"""
