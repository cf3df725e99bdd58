"""Waiting for a quota slot: on PostgreSQL, the trigger function and the triggers of
``durable_run_tag`` that notify a quota key's channel when one of its runs leaves an
active status, in the transaction of that transition (``LISTEN``/``NOTIFY``)."""

from django.db import migrations

import durable_django.stores.postgres.operations


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0004_start_runs_function'),
    ]

    operations = [
        durable_django.stores.postgres.operations.InstallFunctions(
            names=[
                'durable_quota_release_notify_v1',
            ],
        ),
        durable_django.stores.postgres.operations.InstallReleaseTriggers(
            function='durable_quota_release_notify_v1',
        ),
    ]
