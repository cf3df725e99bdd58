"""Weighted quotas and several quotas per start: the weight a run occupies on each of its
quota tags (``RunTag.weight``, 1 for the rows already there), and the PostgreSQL functions
that lock several keys and start a run under several weighted quotas."""

from django.db import migrations, models

import durable_django.stores.postgres.operations


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0002_postgresql_functions'),
    ]

    operations = [
        migrations.AddField(
            model_name='runtag',
            name='weight',
            field=models.PositiveIntegerField(db_default=1, default=1, help_text='The units of its quota the run occupies (1 for a tag of no quota).'),
        ),
        durable_django.stores.postgres.operations.InstallFunctions(
            names=[
                'durable_lock_quota_keys_v1',
                'durable_start_run_v2',
            ],
        ),
    ]
