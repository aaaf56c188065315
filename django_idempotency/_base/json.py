"""JSON written by the ``json`` module's C encoder, made once.

``JSONEncoder.encode`` (and so ``json.dumps``) makes its C encoder again on every call, which
costs a small document more than writing it does. :func:`acyclic_encoder` makes it
once, for documents that cannot hold themselves (parsed JSON, the app's own lists): without
the table of containers being written, which is what finds a cycle.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import encode_basestring, encode_basestring_ascii
from typing import Any


def acyclic_encoder(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode`` for acyclic documents; ``encoder.encode`` itself where the C encoder
    is missing (another Python) or takes other arguments, or ``encoder`` indents."""
    make: Any = getattr(json.encoder, "c_make_encoder", None)
    if make is None or encoder.indent is not None:
        return encoder.encode
    strings = encode_basestring_ascii if encoder.ensure_ascii else encode_basestring
    try:
        chunks = make(
            None,  # no table of containers: no cycle is looked for
            encoder.default,
            strings,
            None,
            encoder.key_separator,
            encoder.item_separator,
            encoder.sort_keys,
            encoder.skipkeys,
            encoder.allow_nan,
        )
    except TypeError:  # another signature
        return encoder.encode
    return lambda document: "".join(chunks(document, 0))
