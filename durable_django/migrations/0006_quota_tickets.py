"""Fair quotas: the tickets kept for refused starts that came back, their places in their
key's line (``QuotaTicket``)."""

import durable_django.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('durable_django', '0005_quota_release_notify'),
    ]

    operations = [
        migrations.CreateModel(
            name='QuotaTicket',
            fields=[
                ('id', models.CharField(max_length=32, primary_key=True, serialize=False)),
                ('quota_key', durable_django.fields.ExactCharField(max_length=255)),
                ('joined_at', models.DateTimeField(help_text="When its client first came back with it: its place in the key's line.")),
                ('weight', models.PositiveIntegerField(default=1)),
                ('expires_at', models.DateTimeField(help_text='Past this, the ticket holds no place.')),
            ],
            options={
                'verbose_name': 'quota ticket',
                'verbose_name_plural': 'quota tickets',
                'db_table': 'durable_quota_ticket',
                'indexes': [models.Index(fields=['quota_key', 'joined_at'], name='durable_ticket_line')],
            },
        ),
    ]
