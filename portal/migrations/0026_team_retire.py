# Retired teams stay for the audit and decision logs.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0025_config_managed"),
    ]

    operations = [
        migrations.AddField(
            model_name="team",
            name="retired_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
