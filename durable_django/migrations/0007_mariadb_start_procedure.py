"""A start in one call on MariaDB: the procedure ``durable_start_run_mariadb_v1`` of
``durable_django/stores/mariadb/procedures.sql``, installed on MariaDB databases the
routers let durable_django migrate; other databases get nothing."""

from django.db import migrations

import durable_django.stores.mariadb.operations


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0006_quota_tickets'),
    ]

    operations = [
        durable_django.stores.mariadb.operations.InstallProcedures(
            names=['durable_start_run_mariadb_v1'],
        ),
    ]
