"""The PostgreSQL function ``durable_start_runs_v1``: a batch of starts in one call."""

from django.db import migrations

import durable_django.stores.postgres.operations


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0002_postgresql_functions'),
    ]

    operations = [
        durable_django.stores.postgres.operations.InstallFunctions(
            names=['durable_start_runs_v1'],
        ),
    ]
