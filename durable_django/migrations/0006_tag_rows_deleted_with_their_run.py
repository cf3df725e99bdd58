"""A run's tag rows deleted with it by a trigger on ``durable_run``, in place of their
foreign key to it: every tag row is inserted with its run or under its row lock, so the
key's check per insert only repeated that, and a run deleted by hand now frees its
quota's slot where the key made the ``DELETE`` fail (``durable_django.stores.run_deletion``)."""

import django.db.models.deletion
import durable_django.stores.postgres.operations
import durable_django.stores.run_deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0005_batch_start_in_columns'),
    ]

    operations = [
        migrations.AlterField(
            model_name='runtag',
            name='run',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='tag_rows', to='durable_django.run'),
        ),
        durable_django.stores.postgres.operations.InstallFunctions(
            names=['durable_run_deleted_v1'],
        ),
        durable_django.stores.run_deletion.DeleteTagRowsWithRun(
            function='durable_run_deleted_v1',
        ),
    ]
