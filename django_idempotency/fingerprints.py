"""The request fingerprint: what makes a retry "the same request".

SHA-256 over the method, the path with its query string, the scope and the body. JSON bodies are
canonicalised first, so key order and whitespace do not matter; other bodies count byte for byte.
"""

from __future__ import annotations

import hashlib
import json

from django.http import HttpRequest


def request_fingerprint(request: HttpRequest, scope: str) -> str:
    digest = hashlib.sha256()
    for part in (request.method or "", request.get_full_path(), scope):
        digest.update(part.encode("utf-8", "surrogateescape"))
        digest.update(b"\0")
    digest.update(canonical_body(request.content_type or "", request.body))
    return digest.hexdigest()


def canonical_body(content_type: str, body: bytes) -> bytes:
    """The body as fingerprinted: canonical JSON for JSON media types, else the bytes."""
    if body and _is_json(content_type):
        try:
            document = json.loads(body)
        except ValueError:
            return body
        return json.dumps(
            document, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8", "surrogateescape")
    return body


def _is_json(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")
