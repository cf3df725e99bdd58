"""The server-side routines of the ORM store's fast paths, each dialect's from its file:
on PostgreSQL the functions of ``stores/postgres/functions.sql`` and the triggers of
``durable_run_tag`` notifying a quota slot's release; on MariaDB the procedures of
``stores/mariadb/procedures.sql``. Only databases of that dialect the routers let
durable_django migrate get them; other databases get nothing."""

from django.db import migrations

import durable_django.stores.mariadb.operations
import durable_django.stores.postgres.operations


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0001_initial'),
    ]

    operations = [
        durable_django.stores.postgres.operations.InstallFunctions(
            names=[
                'durable_lock_quota_key_v1',
                'durable_claim_run_v1',
                'durable_record_held_step_v1',
                'durable_transition_v1',
                'durable_lock_quota_keys_v1',
                'durable_start_run_v2',
                'durable_quota_release_notify_v1',
                'durable_start_runs_v2',
                'durable_record_held_step_v2',
            ],
        ),
        durable_django.stores.postgres.operations.InstallReleaseTriggers(
            function='durable_quota_release_notify_v1',
        ),
        durable_django.stores.mariadb.operations.InstallProcedures(
            names=['durable_start_run_mariadb_v1'],
        ),
    ]
