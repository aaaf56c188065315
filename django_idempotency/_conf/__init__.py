"""Settings and options: what a project and a view may say, and the typed reads of it.

Owns ``settings.IDEMPOTENCY`` (:mod:`.settings`: each setting and view option declared once,
read through ``conf``), what a value may be (:mod:`.values`), and a view's options and the
policy they make with the settings (:mod:`.options`). May import :mod:`.._base` only.
"""
