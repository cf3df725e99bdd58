"""The PostgreSQL function ``durable_start_runs_v1``: a batch of starts in one call,
``durable_start_run_v2`` per element."""

from django.db import migrations

import durable_django.stores.postgres.operations


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0003_quota_weights'),
    ]

    operations = [
        durable_django.stores.postgres.operations.InstallFunctions(
            names=['durable_start_runs_v1'],
        ),
    ]
