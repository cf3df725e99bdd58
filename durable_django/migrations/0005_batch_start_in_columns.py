"""The batch start function installed again over the version 0003_quota_overrides
installed: it now reads its batch as columns, one array per field, numbered by the
caller (``durable_django.stores.postgres.batch_columns``), instead of one object per
start that it read and numbered itself."""

from django.db import migrations

import durable_django.stores.postgres.operations


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0004_lean_turn'),
    ]

    operations = [
        durable_django.stores.postgres.operations.InstallFunctions(
            names=['durable_start_runs_v2'],
            replace=True,
        ),
    ]
