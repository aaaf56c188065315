"""The HTTP side: a request and a response around the core of :mod:`.._call`.

Owns the adapter shared by the decorator, the DRF mixin and ninja (:mod:`.adapter`), the view
decorator (:mod:`.decorators`), the request's body, fingerprint and scope (:mod:`.bodies`,
:mod:`.canonical_json`, :mod:`.fingerprints`, :mod:`.scopes`), a response stored and replayed
(:mod:`.responses`), the app's problem responses (:mod:`.problems`) and long-running
operations (:mod:`.operations`: the status endpoint, ``complete_operation()``). May import
:mod:`.._call` and everything below it.
"""
