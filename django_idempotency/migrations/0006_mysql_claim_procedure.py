"""MySQL and MariaDB only: the claim procedure reads the key's record, and inserts a new key,
in one round trip (``django_idempotency._store.mysql``): a two-phase first execution is one
statement again, as a replay is.

Its parameters take the types of the table's columns as the table has them (with their
character sets and collations), read when it is made. Self-contained: a copy of
``claim_procedure_sql()`` as it was when written (``tests/test_claim_procedure_mysql.py`` checks
the copy and the code agree). Where it cannot be made (no ``CREATE ROUTINE`` privilege, a server
that refuses it) a warning says so and the claim stays plain statements, as without this
migration. Unapplied, the procedure is dropped. Other databases: nothing.
"""

import logging

from django.apps.registry import Apps
from django.db import DatabaseError, migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

logger = logging.getLogger("django_idempotency")

TEMPLATE = """\
CREATE PROCEDURE django_idempotency_claim(
    IN p_scope {scope},
    IN p_key_hash {key_hash},
    IN p_method {method},
    IN p_path {path},
    IN p_request_hash {request_hash},
    IN p_lock_token {lock_token},
    IN p_created_at {created_at},
    IN p_updated_at {updated_at},
    IN p_unlock_at {unlock_at},
    IN p_expires_at {expires_at}
)
MODIFIES SQL DATA
BEGIN
    DECLARE CONTINUE HANDLER FOR 1062 BEGIN END;
    IF NOT EXISTS (SELECT 1 FROM `django_idempotency_idempotencykey` WHERE `scope` = p_scope AND `key_hash` = p_key_hash) THEN
        INSERT INTO `django_idempotency_idempotencykey` (`scope`, `key_hash`, `method`, `path`, `request_hash`, `status`, `response_headers`, `recovery_point`, `lock_token`, `attempt`, `created_at`, `updated_at`, `unlock_at`, `expires_at`) VALUES (p_scope, p_key_hash, p_method, p_path, p_request_hash, 'processing', '[]', '', p_lock_token, 1, p_created_at, p_updated_at, p_unlock_at, p_expires_at);
    END IF;
    SELECT `id`, `scope`, `key_hash`, `method`, `path`, `request_hash`, `status`, `response_status`, `response_headers`, `response_body`, `recovery_point`, `recovery_data`, `lock_token`, `attempt`, `created_at`, `updated_at`, `unlock_at`, `expires_at` FROM `django_idempotency_idempotencykey` WHERE `scope` = p_scope AND `key_hash` = p_key_hash;
END"""

DROP = "DROP PROCEDURE IF EXISTS django_idempotency_claim"
COLUMN_TYPES = (
    "SELECT COLUMN_NAME, COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME "
    "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s"
)
#: Access denied: to the database, a table, a privilege (``CREATE ROUTINE``), a routine.
DENIED = {1044, 1142, 1227, 1370}


def types(schema_editor: BaseDatabaseSchemaEditor) -> dict[str, str]:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(COLUMN_TYPES, ["django_idempotency_idempotencykey"])
        rows = cursor.fetchall()
    return {
        name: f"{kind} CHARACTER SET {charset} COLLATE {collation}" if charset else kind
        for name, kind, charset, collation in rows
    }


def create(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    try:
        schema_editor.execute(DROP)
        schema_editor.execute(TEMPLATE.format(**types(schema_editor)))
    except DatabaseError as exc:
        # Not made: the claim finds it absent and sends plain statements, as it would
        # without this migration. Nothing is lost but a round trip.
        args = getattr(exc.__cause__, "args", ())
        hint = (
            "grant CREATE ROUTINE, then run migrate django_idempotency 0005 and migrate"
            if args and args[0] in DENIED
            else "please report it"
        )
        logger.warning(
            "django_idempotency: the claim procedure was not made (%s); claims send plain "
            "statements instead (a first execution two): %s.",
            exc,
            hint,
        )


def drop(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    # MySQL cannot roll back DDL, and Django refuses it inside the migration's transaction.
    atomic = False
    dependencies = [("django_idempotency", "0005_stored_response_permission")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
