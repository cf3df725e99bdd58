"""The PostgreSQL functions of ``durable_django/stores/postgres/functions.sql``, the ORM
store's fast path, installed on PostgreSQL databases the routers let durable_django
migrate; other databases get nothing."""

from django.db import migrations

import durable_django.stores.postgres.operations


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0001_initial'),
    ]

    operations = [
        durable_django.stores.postgres.operations.InstallFunctions(
            names=[
                'durable_lock_quota_key_v1',
                'durable_start_run_v1',
                'durable_claim_run_v1',
                'durable_record_held_step_v1',
                'durable_transition_v1',
            ],
        ),
    ]
