"""The store's unique key led by the last death's time (recovery.models.store.FINGERPRINT_KEY):
the index grows at its newest end instead of taking each insert on a random page.

Built CONCURRENTLY (the collector keeps storing meanwhile; minutes at 10M messages), so not in
one transaction. Stop the collectors while it runs all the same: between the old constraint's
drop and the new code's start, an old collector's ``ON CONFLICT (fingerprint)`` names an index
that is gone and its batch fails (redelivered, not lost). A build that fails leaves an invalid
index behind; running the migration again drops it first."""

import datetime

from django.db import migrations, models
from django.db.models.functions import Coalesce

NEW = "msg_fingerprint_by_death"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("recovery", "0026_masking"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="message", name="msg_fingerprint"),
                migrations.AddConstraint(
                    model_name="message",
                    constraint=models.UniqueConstraint(
                        Coalesce(
                            "last_death_at",
                            models.Value(datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)),
                        ),
                        "fingerprint",
                        name="msg_fingerprint",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(f"DROP INDEX CONCURRENTLY IF EXISTS {NEW}", migrations.RunSQL.noop),
                migrations.RunSQL(
                    f"CREATE UNIQUE INDEX CONCURRENTLY {NEW} ON recovery_message "
                    "((COALESCE(last_death_at, '1970-01-01 00:00:00+00'::timestamptz)), fingerprint)",
                    f"DROP INDEX CONCURRENTLY IF EXISTS {NEW}",
                ),
                migrations.RunSQL(
                    "ALTER TABLE recovery_message DROP CONSTRAINT msg_fingerprint",
                    "ALTER TABLE recovery_message ADD CONSTRAINT msg_fingerprint UNIQUE (fingerprint)",
                ),
                migrations.RunSQL(
                    f"ALTER INDEX {NEW} RENAME TO msg_fingerprint",
                    f"ALTER INDEX msg_fingerprint RENAME TO {NEW}",
                ),
            ],
        ),
    ]
