"""Publishing: the policy each protected operation shows its clients.

Owns the published policy (:mod:`.policy`, ``describe()``), the parts of an operation's
description (:mod:`.parts`), and the OpenAPI of drf-spectacular (:mod:`.openapi`) and of ninja
(:mod:`.ninja_openapi`). May import :mod:`.._http`, :mod:`.._conf` and :mod:`.._base`.
"""
