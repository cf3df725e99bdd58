"""The PostgreSQL function ``durable_start_runs_v2``: a batch of starts in one call, decided
set-based (each key's units counted once, the runs and their tags inserted by one
statement each). ``durable_start_runs_v1`` stays installed for the previous release's
workers during a rolling deploy."""

from django.db import migrations

import durable_django.stores.postgres.operations


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0007_mariadb_start_procedure'),
    ]

    operations = [
        durable_django.stores.postgres.operations.InstallFunctions(
            names=['durable_start_runs_v2'],
        ),
    ]
