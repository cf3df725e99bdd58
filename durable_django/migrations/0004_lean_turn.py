"""A leaner turn on the server: ``durable_run`` without its index on
``(namespace, status)``, whose queries the status and creation-time indexes serve; every
status change of a run wrote an entry in it."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0003_quota_overrides'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='run',
            name='durable_run_namespace_idx',
        ),
    ]
