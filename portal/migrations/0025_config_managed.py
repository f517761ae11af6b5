# Retired pools and classes stay for the audit and decision logs; config_managed marks rows `config apply` wrote.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0024_class_bindings"),
    ]

    operations = [
        migrations.AddField(
            model_name="team",
            name="groups",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="pool",
            name="config_managed",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="pool",
            name="retired_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="team",
            name="config_managed",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="workloadclass",
            name="config_managed",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="workloadclass",
            name="retired_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
