"""MySQL and MariaDB only: the scope and the fingerprint compare exactly.

Their columns took the database's collation, case- and accent-insensitive (``utf8mb4_general_ci``,
``utf8mb4_unicode_ci``, ``utf8mb4_uca1400_ai_ci``...): there ``Tenant:A``, ``tenant:a`` and
``tenant:ä`` were one scope, so one principal was replayed another's response and
``erase_scope("Tenant:A")`` deleted ``tenant:a``'s records. The claim's takeover re-checks the
fingerprint in SQL, which must mean what its test in Python means. PostgreSQL's and SQLite's
``=`` is exact already: nothing is done there.

Each column keeps its character set and takes that set's binary collation, comparing code
points, without padding where the server has one: ``utf8mb4_0900_bin`` on MySQL 8.0.17+,
``utf8mb4_nopad_bin`` on MariaDB. Else (MySQL before 8.0.17) ``utf8mb4_bin``, which ignores
trailing spaces: no scope may have any (``django_idempotency._store.limits.padded``). Django's
``db_collation`` would name one collation for every database, so the model does not say it:
a later migration that alters either field must apply it again (Django's ``MODIFY`` drops
it), and ``tests/test_exact_scopes.py`` fails if it is lost.

The claim procedure (``0006_mysql_claim_procedure``), where present, is made again: its
parameters take the columns' collations. The table is rebuilt (it holds live records only).
Unapplied, nothing is undone: going back could merge two principals' records.
"""

import importlib

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

TABLE = "django_idempotency_idempotencykey"
COLUMNS = ("scope", "request_hash")
#: The binary collations of a character set, the best first (no padding, then any).
CANDIDATES = ("{}_0900_bin", "{}_nopad_bin", "{}_bin")
_READ = (
    "SELECT COLUMN_NAME, COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME, IS_NULLABLE "
    "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s "
    "AND COLUMN_NAME IN (%s, %s)"
)
_COLLATIONS = "SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE CHARACTER_SET_NAME = %s"
_PROCEDURE = (
    "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() "
    "AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME = 'django_idempotency_claim'"
)


def exact(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    q = connection.ops.quote_name
    changes = []
    with connection.cursor() as cursor:
        cursor.execute(_READ, [TABLE, *COLUMNS])
        for name, kind, charset, collation, nullable in cursor.fetchall():
            cursor.execute(_COLLATIONS, [charset])
            known = {row[0] for row in cursor.fetchall()}
            binary = next(c.format(charset) for c in CANDIDATES if c.format(charset) in known)
            if collation != binary:
                null = "NULL" if nullable == "YES" else "NOT NULL"
                changes.append(
                    f"MODIFY {q(name)} {kind} CHARACTER SET {charset} COLLATE {binary} {null}"
                )
        cursor.execute(_PROCEDURE)
        (procedure,) = cursor.fetchone()
    if not changes:
        return
    schema_editor.execute(f"ALTER TABLE {q(TABLE)} {', '.join(changes)}")
    if procedure:
        # Made again with the parameters' new types (a copy of the claim's text would be a
        # second one to keep in step with the code: this migration has none).
        made = importlib.import_module("django_idempotency.migrations.0006_mysql_claim_procedure")
        made.create(apps, schema_editor)


class Migration(migrations.Migration):
    # MySQL cannot roll back DDL, and Django refuses it inside the migration's transaction.
    atomic = False
    dependencies = [("django_idempotency", "0006_mysql_claim_procedure")]

    operations = [migrations.RunPython(exact, migrations.RunPython.noop, elidable=False)]
