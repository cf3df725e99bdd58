"""The PostgreSQL function ``durable_record_held_step_v2``: a transactional step's record,
raising when the run is no longer held, so that the record and the ``COMMIT`` go to the
server in one round trip. ``durable_record_held_step_v1`` stays: ``ctx.step``'s records
call it, as the previous release's workers do."""

from django.db import migrations

import durable_django.stores.postgres.operations


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0008_start_runs_set_based'),
    ]

    operations = [
        durable_django.stores.postgres.operations.InstallFunctions(
            names=['durable_record_held_step_v2'],
        ),
    ]
