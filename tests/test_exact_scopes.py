"""Scopes compare exactly on every database (issue 38): two principals whose scopes differ only
by case or accent (``Tenant:A``, ``tenant:a``, ``tenant:ä``) never share a record.

MySQL and MariaDB compared them in the database's collation, case- and accent-insensitive, until
migration ``0007_exact_text_comparison``: one principal was replayed another's response, and
erasing one scope deleted the others' records.
"""

from __future__ import annotations

import hashlib
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import RequestFactory

from django_idempotency import Erasure, erase_scope, idempotent
from django_idempotency._store.mysql import CLAIM_PROCEDURE, MySQLStore
from django_idempotency.models import IdempotencyKey
from tests import factories
from tests.conftest import executions
from tests.factories import IdempotencyKeyFactory
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db

#: One scope each in a case- and accent-insensitive collation; three principals here.
SCOPES = ["Tenant:A", "tenant:a", "tenant:ä"]


def tenant_scope(request: HttpRequest) -> str:
    """The scope a project might make of an API key's tenant: as it is, case and all."""
    return request.headers["X-Tenant"]


def body_fingerprint(request: HttpRequest, scope: str) -> str:
    """Counts the body alone (a fingerprint may leave the scope out): only the record's scope
    then keeps one principal's retry from another's response."""
    return hashlib.sha256(request.body).hexdigest()


@idempotent(scope=tenant_scope, fingerprint=body_fingerprint)
def create_order(request: HttpRequest) -> HttpResponse:
    execution = Execution.objects.create(label="order", payload=request.headers["X-Tenant"])
    return JsonResponse({"id": execution.pk, "tenant": execution.payload}, status=201)


def order(scope: str, key: str) -> Any:
    request = RequestFactory().post(
        "/orders/",
        {"amount": 5},
        content_type="application/json",
        headers={"Idempotency-Key": key, "X-Tenant": scope},
    )
    return create_order(request)


def test_scopes_differing_by_case_or_accent_are_principals_of_their_own() -> None:
    key = str(uuid.uuid4())
    first = {scope: order(scope, key) for scope in SCOPES}
    assert [response.status_code for response in first.values()] == [201] * 3
    assert executions("order") == 3
    assert sorted(IdempotencyKey.objects.values_list("scope", flat=True)) == sorted(SCOPES)
    for scope, response in first.items():
        answer = order(scope, key)  # each principal's retry: its own response, replayed
        assert (answer.status_code, answer.content) == (201, response.content)
        assert answer.headers["Idempotent-Replayed"] == "true"
    assert executions("order") == 3


def test_erasing_a_scope_leaves_the_scopes_differing_by_case_or_accent() -> None:
    for scope in SCOPES:
        IdempotencyKeyFactory(scope=scope, completed=True)
    assert erase_scope("Tenant:A") == Erasure("Tenant:A", 1, 0)
    out = StringIO()
    call_command("idempotency_cleanup", "--scope", "tenant:a", stdout=out)
    assert out.getvalue() == "Deleted 1 finished idempotency record of scope 'tenant:a'.\n"
    assert list(IdempotencyKey.objects.values_list("scope", flat=True)) == ["tenant:ä"]


@pytest.mark.mysql
def test_mysql_compares_the_scope_and_fingerprint_by_code_point() -> None:
    """The columns take their character set's binary collation (no padding where the server
    has one), and the claim procedure's parameters theirs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s "
            "AND COLUMN_NAME IN ('scope', 'request_hash')",
            [IdempotencyKey._meta.db_table],
        )
        collations = dict(cursor.fetchall())
        cursor.execute(
            "SELECT COLLATION_NAME FROM information_schema.PARAMETERS "
            "WHERE SPECIFIC_SCHEMA = DATABASE() AND SPECIFIC_NAME = %s "
            "AND PARAMETER_NAME IN ('p_scope', 'p_request_hash') ORDER BY PARAMETER_NAME",
            [CLAIM_PROCEDURE],
        )
        parameters = [row[0] for row in cursor.fetchall()]
    assert collations["scope"] in ("utf8mb4_nopad_bin", "utf8mb4_0900_bin"), collations
    assert collations["request_hash"] == collations["scope"]
    assert parameters == [collations["request_hash"], collations["scope"]]
    IdempotencyKeyFactory(scope="tenant:a")
    assert not IdempotencyKey.objects.filter(scope="tenant:a ").exists()  # no padding


#: What a session's reads did: by key (an index lookup), the next row of an index range, the
#: next row of a table scan.
READS = ("Handler_read_key", "Handler_read_next", "Handler_read_rnd_next")


def reads() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS WHERE Variable_name IN (%s, %s, %s)", list(READS))
        return {name: int(value) for name, value in cursor.fetchall()}


@pytest.mark.mysql
def test_the_claim_procedure_reads_the_record_through_the_unique_index() -> None:
    """Comparing the parameters with the columns keeps to the ``(scope, key_hash)`` index:
    lookups by key alone, no row of a range or a scan, among a few hundred records."""
    IdempotencyKey.objects.bulk_create(
        IdempotencyKeyFactory.build(scope=f"tenant:{number}", completed=True)
        for number in range(300)
    )
    record = IdempotencyKeyFactory(scope="tenant:Z", completed=True)
    assert MySQLStore("default").has_procedure(connection)  # checked once: not counted
    before = reads()
    found = factories.claim(key_hash=record.key_hash, scope="tenant:Z")
    after = reads()
    assert isinstance(found, IdempotencyKey) and found.pk == record.pk
    delta = {name: after[name] - before[name] for name in READS}
    assert delta["Handler_read_key"] >= 2  # the procedure's two reads
    assert delta["Handler_read_next"] == delta["Handler_read_rnd_next"] == 0, delta
