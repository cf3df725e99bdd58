"""Run ids, quota keys, tags, workflow names, namespaces, signal tokens and schedule keys
compare byte for byte: their fields become ``ExactCharField``.

On MySQL/MariaDB that gives their columns (and the foreign keys to ``durable_run.id``)
a binary, no-pad collation, ``utf8mb4_nopad_bin`` on MariaDB and ``utf8mb4_0900_bin``
on MySQL, picked by the server the migration runs on. Django's ``AlterField`` drops the
foreign keys of ``durable_run_tag.run_id`` and ``durable_step.run_id``, changes the
collation of ``durable_run.id`` and of both, and adds the foreign keys again. Each
``ALTER TABLE`` rebuilds its table. Backwards, the columns return to the table's default
collation.

PostgreSQL and SQLite compare these columns byte for byte already: nothing changes there
(on SQLite an ``AlterField`` would rebuild every table for nothing).
"""

from django.db import migrations

import durable_django.fields


class AlterFieldOnMySQL(migrations.AlterField):
    """``AlterField`` whose schema change is made on MySQL/MariaDB only."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "mysql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "mysql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0008_no_run_id_indexes'),
    ]

    operations = [
        AlterFieldOnMySQL(
            model_name='run',
            name='id',
            field=durable_django.fields.ExactCharField(max_length=255, primary_key=True, serialize=False, verbose_name='run id'),
        ),
        AlterFieldOnMySQL(
            model_name='quotalock',
            name='key',
            field=durable_django.fields.ExactCharField(max_length=255, primary_key=True, serialize=False),
        ),
        AlterFieldOnMySQL(
            model_name='run',
            name='namespace',
            field=durable_django.fields.ExactCharField(default='default', max_length=100),
        ),
        AlterFieldOnMySQL(
            model_name='run',
            name='parent_id',
            field=durable_django.fields.ExactCharField(blank=True, db_index=True, max_length=255, null=True),
        ),
        AlterFieldOnMySQL(
            model_name='run',
            name='workflow',
            field=durable_django.fields.ExactCharField(help_text="The workflow's registered name.", max_length=200),
        ),
        AlterFieldOnMySQL(
            model_name='runtag',
            name='namespace',
            field=durable_django.fields.ExactCharField(help_text="Copy of the run's namespace.", max_length=100),
        ),
        AlterFieldOnMySQL(
            model_name='runtag',
            name='tag',
            field=durable_django.fields.ExactCharField(max_length=255),
        ),
        AlterFieldOnMySQL(
            model_name='schedule',
            name='concurrency_key',
            field=durable_django.fields.ExactCharField(blank=True, default='', help_text="Quota key of the schedule's own; empty: the workflow's quota applies.", max_length=200),
        ),
        AlterFieldOnMySQL(
            model_name='schedule',
            name='key',
            field=durable_django.fields.ExactCharField(help_text='Stable name of the schedule.', max_length=200, unique=True),
        ),
        AlterFieldOnMySQL(
            model_name='schedule',
            name='last_run_id',
            field=durable_django.fields.ExactCharField(blank=True, default='', max_length=255),
        ),
        AlterFieldOnMySQL(
            model_name='schedule',
            name='workflow',
            field=durable_django.fields.ExactCharField(help_text='The registered workflow to start.', max_length=200),
        ),
        AlterFieldOnMySQL(
            model_name='signal',
            name='consumed_by',
            field=durable_django.fields.ExactCharField(blank=True, db_default='', default='', help_text='The run that took it.', max_length=255),
        ),
        AlterFieldOnMySQL(
            model_name='signal',
            name='token',
            field=durable_django.fields.ExactCharField(max_length=255),
        ),
    ]
