"""Operators' overrides of quota limits (``QuotaOverride``), and the start routines
that read them, installed again over the versions 0002_routines installed: their
results now carry the limit a refused start met."""

import django.utils.timezone
import durable_django.fields
import durable_django.stores.mariadb.operations
import durable_django.stores.postgres.operations
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0002_routines'),
    ]

    operations = [
        migrations.CreateModel(
            name='QuotaOverride',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tag', durable_django.fields.ExactCharField(help_text="The key's tag: concurrency:<key>, or rate:<key> for a rate key.", max_length=255)),
                ('scope', durable_django.fields.ExactCharField(blank=True, help_text='The namespace whose starts it applies to; empty: those counting every one.', max_length=100)),
                ('limit', models.PositiveIntegerField(db_column='quota_limit', help_text='The limit in force while it lasts; 0 pauses the key.')),
                ('until', models.DateTimeField(blank=True, help_text='When it ends by itself; empty: when it is cleared.', null=True)),
                ('changed_at', models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                'verbose_name': 'quota override',
                'verbose_name_plural': 'quota overrides',
                'db_table': 'durable_quota_override',
                'constraints': [models.UniqueConstraint(fields=('tag', 'scope'), name='durable_override_unique')],
            },
        ),
        durable_django.stores.postgres.operations.InstallFunctions(
            names=['durable_start_run_v2', 'durable_start_runs_v2'],
            replace=True,
        ),
        durable_django.stores.mariadb.operations.InstallProcedures(
            names=['durable_start_run_mariadb_v1'],
            replace=True,
        ),
    ]
