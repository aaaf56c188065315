"""The request fingerprint: what makes a retry "the same request".

SHA-256 over the method, the path with its query string, the scope and the body. JSON bodies are
canonicalised first (:mod:`._canonical_json`), so key order and whitespace do not matter; a
``multipart/form-data`` POST counts by its fields and files, not its random part boundary; other
bodies count byte for byte. Large bodies are hashed in chunks (:mod:`._bodies`).
"""

from __future__ import annotations

import hashlib

from django.http import HttpRequest

from django_idempotency import _bodies as bodies
from django_idempotency._canonical_json import canonical_json


def request_fingerprint(request: HttpRequest, scope: str) -> str:
    digest = hashlib.sha256()
    for part in (request.method or "", request.get_full_path(), scope):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    if bodies.is_form_upload(request):
        digest.update(b"form\0")
        bodies.feed_form(digest, request)
        return digest.hexdigest()
    body = bodies.body_chunks(request)
    if isinstance(body, bytes) and body and _is_json(request.content_type or ""):
        canonical = canonical_json(body)
        if canonical is not None:
            # Tagged apart from raw bodies: "[]" as text is not " []" as JSON.
            digest.update(b"json\0")
            digest.update(canonical)
            return digest.hexdigest()
    digest.update(b"body\0")
    # Over DATA_UPLOAD_MAX_MEMORY_SIZE the body comes in chunks, and counts byte for byte.
    for chunk in [body] if isinstance(body, bytes) else body:
        digest.update(chunk)
    return digest.hexdigest()


def canonical_body(content_type: str, body: bytes) -> bytes:
    """The body as fingerprinted: canonical JSON for JSON media types, else the bytes."""
    if body and _is_json(content_type):
        canonical = canonical_json(body)
        return body if canonical is None else canonical
    return body


def _is_json(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")
