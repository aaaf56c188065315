"""PostgreSQL only: the claim function's takeover of a stale record keeps its expiry no earlier
than the new lock's end (``django_idempotency._store.statements``): a record taken over just
before its TTL ran out was otherwise expired while its new owner ran, and the next claim took it
over as expired, running the view a second time. Renewals and recovery points keep the same
rule in their own statements.

Self-contained: the function's text is here alone (``tests/test_claim_function_postgresql.py``
checks that its statements are the ones the code's ``Statements`` build); its arguments are
0004's, so it is replaced in place. Unapplied, 0004's is made again. Other databases: nothing
(their takeover is a statement the code sends).
"""

import importlib
from types import ModuleType

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

CREATE = """\
CREATE OR REPLACE FUNCTION django_idempotency_claim(
    p_scope text,
    p_key_hash text,
    p_method text,
    p_path text,
    p_request_hash text,
    p_lock_token uuid,
    p_now timestamptz,
    p_unlock_at timestamptz,
    p_expires_at timestamptz,
    p_lock_timeout text
) RETURNS SETOF "django_idempotency_idempotencykey" LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    p_processing CONSTANT text := 'processing';
    previous text;
    found_row "django_idempotency_idempotencykey";
    claimed boolean;
    inserted boolean := false;
BEGIN
    SELECT * INTO found_row FROM "django_idempotency_idempotencykey" WHERE "scope" = p_scope AND "key_hash" = p_key_hash;
    claimed := FOUND;
    IF NOT claimed OR (found_row."expires_at" <= p_now OR (found_row."status" = p_processing AND found_row."unlock_at" <= p_now AND found_row."request_hash" = p_request_hash)) THEN
        IF p_lock_timeout IS NOT NULL THEN
            previous := current_setting('lock_timeout');
            PERFORM set_config('lock_timeout', p_lock_timeout, true);
        END IF;
        IF NOT claimed THEN
            INSERT INTO "django_idempotency_idempotencykey" ("scope", "key_hash", "method", "path", "request_hash", "status", "response_headers", "recovery_point", "lock_token", "attempt", "created_at", "updated_at", "unlock_at", "expires_at") VALUES (p_scope, p_key_hash, p_method, p_path, p_request_hash, 'processing', '[]', '', p_lock_token, 1, p_now, p_now, p_unlock_at, p_expires_at) ON CONFLICT ("scope", "key_hash") DO NOTHING RETURNING * INTO found_row;
            inserted := FOUND;
            claimed := FOUND;
            IF NOT claimed THEN
                SELECT * INTO found_row FROM "django_idempotency_idempotencykey" WHERE "scope" = p_scope AND "key_hash" = p_key_hash;
                claimed := FOUND;
            END IF;
        END IF;
        IF claimed AND NOT inserted AND (found_row."expires_at" <= p_now OR (found_row."status" = p_processing AND found_row."unlock_at" <= p_now AND found_row."request_hash" = p_request_hash)) THEN
            UPDATE "django_idempotency_idempotencykey" SET "method" = p_method, "path" = p_path, "request_hash" = p_request_hash, "status" = 'processing', "response_headers" = '[]', "lock_token" = p_lock_token, "updated_at" = p_now, "unlock_at" = p_unlock_at, "response_status" = NULL, "response_body" = NULL, "recovery_point" = CASE WHEN "expires_at" <= p_now THEN '' ELSE "recovery_point" END, "recovery_data" = CASE WHEN "expires_at" <= p_now THEN NULL ELSE "recovery_data" END, "attempt" = CASE WHEN "expires_at" <= p_now THEN 1 ELSE "attempt" + 1 END, "created_at" = CASE WHEN "expires_at" <= p_now THEN p_now ELSE "created_at" END, "expires_at" = CASE WHEN "expires_at" <= p_now THEN p_expires_at ELSE CASE WHEN "expires_at" < p_unlock_at THEN p_unlock_at ELSE "expires_at" END END WHERE "id" = found_row.id AND ("expires_at" <= p_now OR ("status" = p_processing AND "unlock_at" <= p_now AND "request_hash" = p_request_hash)) RETURNING * INTO found_row;
            claimed := FOUND;
        END IF;
        IF p_lock_timeout IS NOT NULL THEN
            PERFORM set_config('lock_timeout', previous, true);
        END IF;
    END IF;
    IF claimed THEN
        RETURN NEXT found_row;
    END IF;
END
$claim$"""


DROP = "DROP FUNCTION IF EXISTS django_idempotency_claim(text, text, text, text, text, uuid, timestamptz, timestamptz, timestamptz, text)"


def _previous() -> ModuleType:
    return importlib.import_module("django_idempotency.migrations.0004_claim_reads_first")


def create(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def restore(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_previous().CREATE)


class Migration(migrations.Migration):
    dependencies = [("django_idempotency", "0008_outbox")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
