"""Parsing the ``Idempotency-Key`` header.

The IETF draft (draft-ietf-httpapi-idempotency-key-header) makes the value a Structured Field
string (RFC 8941 section 3.3.3): ``"8e03978e-..."``. Many clients send the bare value, so a bare
printable-ASCII value is accepted too (``BARE_KEYS``, on by default); ``abc`` and ``"abc"`` spell
the same key. A bare value cannot contain ``,``: that is how a list of values, or two header
lines joined, arrives.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from django_idempotency._base.errors import InvalidKey

MAX_KEY_LENGTH = 255
#: The longest header value: a quoted key of ``MAX_KEY_LENGTH`` characters, every one escaped.
#: It bounds the (ignored) parameters too, so the published schema can state a length.
MAX_HEADER_LENGTH = 2 * MAX_KEY_LENGTH + 2


#: The detail of a bare key refused (``BARE_KEYS = False``).
BARE_KEY_REFUSED = (
    'The Idempotency-Key must be sent quoted, as a Structured Field string: "your-key".'
)


def parse_key(value: str, *, min_length: int = 1, bare: bool = True) -> str:
    """Return the key spelled by a header value, or raise :class:`InvalidKey`.

    ``bare=False`` accepts only the draft's spelling, a Structured Field string.
    """
    value = value.strip(" \t")
    if not value:
        raise InvalidKey("The Idempotency-Key header is empty.")
    if len(value) > MAX_HEADER_LENGTH:
        raise InvalidKey(
            f"The Idempotency-Key header is longer than {MAX_HEADER_LENGTH} characters."
        )
    if not value.isascii() or not value.isprintable():
        raise InvalidKey("The Idempotency-Key must be printable ASCII.")
    if value.startswith('"'):
        key = _parse_sf_string(value)
    elif not bare:
        raise InvalidKey(BARE_KEY_REFUSED)
    elif "," in value:
        # Two header lines reach the view joined by "," (WSGI servers, Django's ASGI handler),
        # as does a list sent on one line: never one merged key.
        raise InvalidKey("The Idempotency-Key header has more than one value.")
    else:
        key = value
    if not key:
        raise InvalidKey("The Idempotency-Key header is empty.")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"The Idempotency-Key is longer than {MAX_KEY_LENGTH} characters.")
    if len(key) < min_length:
        raise InvalidKey(f"The Idempotency-Key is shorter than {min_length} characters.")
    return key


#: A UUID as RFC 9562 writes it: 8-4-4-4-12 hexadecimal digits, any version. Either case is
#: accepted and both spell the same UUID (RFC 9562 section 4: "case insensitive on input"), so
#: :meth:`KeyFormat.check` gives the key in lower case: a client that retries with the other
#: case is replayed, never charged twice.
UUID_PATTERN = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
KEY_FORMATS = ("any", "uuid")


@dataclass(frozen=True)
class KeyFormat:
    """What a key must look like once parsed (``KEY_FORMAT``, the ``key_format`` option).

    It restricts the key, not its spelling: ``"8e03978e-..."`` and its bare form are the same
    key, and both are accepted unless ``BARE_KEYS`` refuses the bare spelling.
    """

    #: ``"any"``, ``"uuid"`` or ``"pattern"`` (a compiled regular expression of your own).
    name: str
    #: What the key must match in full; ``None`` for ``"any"``.
    pattern: re.Pattern[str] | None = None

    @property
    def description(self) -> str:
        """The format in words, for the ``400`` problem and the published policy."""
        if self.pattern is None:
            return "any key"
        if self.name == "uuid":
            return "a UUID (8-4-4-4-12 hexadecimal digits)"
        return f"a key matching the regular expression {self.pattern.pattern}"

    def check(self, key: str, subject: str = "The Idempotency-Key") -> str:
        """The key as it is hashed: lower case for ``"uuid"``, whose case means nothing;
        :class:`InvalidKey`, naming the expected format, when ``key`` does not match."""
        if self.pattern is not None and self.pattern.fullmatch(key) is None:
            raise InvalidKey(f"{subject} must be {self.description}.")
        return key.lower() if self.name == "uuid" else key


ANY = KeyFormat("any")
UUID = KeyFormat("uuid", UUID_PATTERN)


def key_format(value: object, name: str = "key_format") -> KeyFormat:
    """The :class:`KeyFormat` of a ``KEY_FORMAT`` value; ``TypeError``/``ValueError`` (naming
    the value ``name``) if bad.

    A string is a name, never a regular expression: a typo (``"uuid4"``) must not silently
    become a pattern that matches only itself.
    """
    if isinstance(value, KeyFormat):
        return value
    if isinstance(value, re.Pattern):
        if not isinstance(value.pattern, str):
            raise TypeError(f"{name} must be a pattern compiled from a str, not bytes.")
        return KeyFormat("pattern", value)
    if value == "any":
        return ANY
    if value == "uuid":
        return UUID
    raise ValueError(
        f"{name} must be 'any', 'uuid' or a compiled regular expression "
        f"(re.compile(...)), not {value!r}."
    )


def _parse_sf_string(value: str) -> str:
    chars: list[str] = []
    index = 1
    while index < len(value):
        char = value[index]
        if char == "\\":
            index += 1
            if index == len(value) or value[index] not in '"\\':
                raise InvalidKey("The Idempotency-Key has an invalid escape sequence.")
            chars.append(value[index])
        elif char == '"':
            rest = value[index + 1 :].lstrip(" \t")
            # Parameters (";name=value") are allowed on any Structured Field item; none are
            # defined for this header, so they are ignored.
            if rest.startswith(","):
                raise InvalidKey("The Idempotency-Key header has more than one value.")
            if rest and not rest.startswith(";"):
                raise InvalidKey("Unexpected characters after the quoted Idempotency-Key.")
            return "".join(chars)
        else:
            chars.append(char)
        index += 1
    raise InvalidKey("The quoted Idempotency-Key has no closing quote.")


def hash_key(key: str) -> str:
    """SHA-256 of the key: the raw key is never stored.

    UTF-8, so any ``str`` key of :func:`~django_idempotency._function.idempotent_function` hashes
    too; a header's key is ASCII, whose bytes are the same.
    """
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
