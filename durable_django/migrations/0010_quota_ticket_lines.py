"""Fair quotas: a kept ticket's line is per namespace (``namespace``), and a ticket is
bound to the hold of its line that it may leave the line with (``held_until``)."""

import durable_django.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0009_record_held_step_and_commit'),
    ]

    operations = [
        migrations.AddField(
            model_name='quotaticket',
            name='held_until',
            field=models.DateTimeField(blank=True, help_text='Bound to a hold of the line: past this, unless the hold ended used, the ticket holds no place.', null=True),
        ),
        migrations.AddField(
            model_name='quotaticket',
            name='namespace',
            field=durable_django.fields.ExactCharField(default='', help_text='The namespace of the engine that kept it: the line it is in.', max_length=100),
        ),
    ]
