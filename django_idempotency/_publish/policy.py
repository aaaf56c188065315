"""The idempotency policy a protected operation publishes to its clients.

The IETF draft (draft-ietf-httpapi-idempotency-key-header-07, "Responsibilities") says a
resource server MUST publish its idempotency policy, including its expiry, and ("Security
Considerations") the format of its keys. :func:`describe` gives that policy as data (the
OpenAPI ``x-idempotency`` extension, or a page of a site without DRF) and :func:`summary` as a
paragraph for people; neither needs DRF. Key formats and scopes are each view's own
(``key_format``, ``scope``), as resolved with the settings into its policy.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

from django_idempotency._base.keys import ANY, MAX_HEADER_LENGTH, MAX_KEY_LENGTH, KeyFormat
from django_idempotency._conf.options import Options, Policy
from django_idempotency._conf.settings import conf
from django_idempotency._http.responses import REPLAYED_HEADER

DRAFT = "https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/"

# The header values keys.parse_key accepts, as an ECMA-262 pattern for OpenAPI: a Structured
# Field string, whose escapes (\" and \\) count as one character of the key, optionally followed
# by parameters (ignored), or (unless BARE_KEYS is off) a bare value of printable ASCII without a
# comma (two values) that does not start with a quote or end with a space.
# tests/test_published.py holds it to parse_key, with bare keys accepted and refused.
_SF_CHAR = r'(?:[ !#-\[\]-~]|\\["\\])'
_PARAMETERS = r"(?: *;(?:[ -~]*[!-~])?)?"
_BARE_FIRST, _BARE_MIDDLE, _BARE_LAST = r"[!#-+\--~]", r"[ -+\--~]", r"[!-+\--~]"


def key_pattern(min_length: int = 1, key_format: KeyFormat = ANY, *, bare: bool = True) -> str:
    """The pattern of the header values the server accepts as keys of ``min_length`` or more,
    and of ``key_format``; quoted only when ``bare`` is false (``BARE_KEYS``)."""
    if key_format.pattern is not None:
        key = ecma_pattern(key_format.pattern)
        # The length limits stay in the schema's minLength and maxLength.
        quoted = f'"(?:{key})"{_PARAMETERS}'
        return f"^(?:{quoted}|(?:{key}))$" if bare else f"^{quoted}$"
    quoted = f'"{_SF_CHAR}{{{min_length},{MAX_KEY_LENGTH}}}"{_PARAMETERS}'
    if not bare:
        return f"^{quoted}$"
    if min_length <= 1:
        unquoted = f"{_BARE_FIRST}(?:{_BARE_MIDDLE}{{0,{MAX_KEY_LENGTH - 2}}}{_BARE_LAST})?"
    else:
        unquoted = (
            f"{_BARE_FIRST}{_BARE_MIDDLE}{{{min_length - 2},{MAX_KEY_LENGTH - 2}}}{_BARE_LAST}"
        )
    return f"^(?:{quoted}|{unquoted})$"


# Python's spellings of what ECMA-262 (the dialect of OpenAPI's "pattern") writes otherwise.
_TO_ECMA = ((re.compile(r"\(\?P<"), "(?<"), (re.compile(r"\(\?P=(\w+)\)"), r"\\k<\1>"))


def ecma_pattern(pattern: re.Pattern[str]) -> str:
    """A ``key_format`` regular expression as OpenAPI's ECMA-262 dialect writes it.

    Named groups are respelled; what ECMA-262 cannot say (flags such as ``re.IGNORECASE``,
    ``\\A``/``\\Z``, possessive quantifiers) is published as written, and
    ``docs/openapi.rst`` says so: keep a published pattern to the common subset.
    """
    text = pattern.pattern
    for python, ecma in _TO_ECMA:
        text = python.sub(ecma, text)
    return text


def key_format(policy: Policy) -> str:
    """The format of the view's keys: ``"any"``, ``"uuid"`` or ``"pattern"`` (in the schema)."""
    return policy.key_format.name


def format_text(policy: Policy) -> str:
    """The key's format in words, after the spelling rules (``""`` when any key goes)."""
    if policy.key_format.pattern is None:
        return ""
    return f"; the key must be {policy.key_format.description}"


def key_schema(policy: Policy) -> dict[str, Any]:
    """The JSON Schema of the header's value."""
    bare = conf.BARE_KEYS
    return {
        "type": "string",
        # A quoted key is two characters longer than the key.
        "minLength": max(1, conf.MIN_KEY_LENGTH) + (0 if bare else 2),
        "maxLength": MAX_HEADER_LENGTH,
        "pattern": key_pattern(conf.MIN_KEY_LENGTH, policy.key_format, bare=bare),
    }


def scope_function(policy: Policy) -> Callable[..., str]:
    """The function naming the principal a key belongs to: the view's, or ``SCOPE_FUNCTION``."""
    return policy.scope


def scope_text(policy: Policy) -> str:
    """What a key is scoped to, for clients: the first line of the scope function's docstring."""
    function = scope_function(policy)
    doc = inspect.getdoc(function)
    if doc:
        return doc.split("\n\n", 1)[0].replace("\n", " ")
    return f"the principal named by {getattr(function, '__qualname__', repr(function))}"


def not_stored(statuses: Collection[int]) -> list[str]:
    """``RETRYABLE_STATUSES`` as OpenAPI writes statuses, a full hundred as ``5XX``."""
    codes = set(statuses)
    written: list[str] = []
    for hundred in range(100, 600, 100):
        block = set(range(hundred, hundred + 100))
        if block <= codes:
            written.append(f"{hundred // 100}XX")
            codes -= block
    return sorted([*map(str, codes), *written])


def describe(view_or_options: object) -> dict[str, Any]:
    """The policy of a protected view: decorated with ``@idempotent``, or with the DRF mixin.

    The mapping the OpenAPI schema shows as ``x-idempotency``; a site without DRF can render it
    on its own documentation page.
    """
    return policy_document(_policy(view_or_options))


def policy_document(policy: Policy) -> dict[str, Any]:
    return {
        "header": conf.HEADER,
        "required": policy.required,
        "keyFormat": key_format(policy),
        "keySchema": key_schema(policy),
        "bareKeys": conf.BARE_KEYS,
        "ttl": int(policy.ttl.total_seconds()),
        "scope": scope_text(policy),
        "methods": sorted(policy.methods),
        "inProgress": policy.in_progress,
        "mismatchStatus": conf.MISMATCH_STATUS,
        "notStored": not_stored(conf.RETRYABLE_STATUSES),
        "replayedHeader": REPLAYED_HEADER,
        "specification": DRAFT,
    }


def summary(policy: Policy) -> str:
    """The policy as a paragraph of Markdown (OpenAPI descriptions are CommonMark)."""
    header = conf.HEADER
    key = f"requires an `{header}` header" if policy.required else f"accepts an `{header}` header"
    scope = scope_text(policy).rstrip(".")
    unique = "a UUID" if policy.key_format.name != "pattern" else policy.key_format.description
    return (
        f"**Idempotency.** This operation {key}: a unique key ({unique}) for each operation. "
        f"Sent again with the same key and request, it returns the first response, with "
        f"`{REPLAYED_HEADER}: true`, instead of running again. Keys are remembered for "
        f"{duration_text(policy.ttl)}, and scoped: {scope[:1].lower()}{scope[1:]}. "
        f"The same key with a different request is refused ({conf.MISMATCH_STATUS}); "
        f"while the first request runs, a retry gets 409 with `Retry-After`. "
        f"Responses {', '.join(not_stored(conf.RETRYABLE_STATUSES))} are not remembered: "
        f"a retry runs the operation again."
    )


def duration_text(duration: timedelta) -> str:
    seconds = int(duration.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def _policy(view_or_options: object) -> Policy:
    if isinstance(view_or_options, Options):
        return view_or_options.resolve()
    return view_options(view_or_options).resolve()


def view_options(view: object) -> Options:
    """The options of a protected view: a function decorated with ``@idempotent``, a class
    with the DRF mixin or a decorated ``dispatch``, or what ``as_view()`` made of either (what
    a URL resolves to)."""
    view = getattr(view, "view_class", None) or getattr(view, "cls", None) or view
    options = getattr(view, "idempotency_options", None)
    if options is None:
        # A class: the DRF mixin's attributes, or @idempotent on its dispatch through
        # method_decorator (which copies the decorated function's attributes).
        getter = getattr(view, "get_idempotency_options", None)
        dispatch = getattr(view, "dispatch", None)
        options = getter() if getter else getattr(dispatch, "idempotency_options", None)
    if not isinstance(options, Options):
        raise TypeError(f"{view!r} is not a protected view.")
    return options
