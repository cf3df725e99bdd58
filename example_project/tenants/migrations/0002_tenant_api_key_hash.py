from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="api_key_hash",
            field=models.CharField(
                blank=True,
                db_index=True,
                editable=False,
                help_text=(
                    "SHA-256 of the tenant's API key; the key itself is shown once, when issued."
                ),
                max_length=64,
            ),
        ),
    ]
