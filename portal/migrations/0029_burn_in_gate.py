from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("portal", "0028_device_foreign")]

    operations = [
        migrations.AddField(
            model_name="pool",
            name="burn_in_new_nodes",
            field=models.BooleanField(default=True),
        ),
        migrations.AddField(
            model_name="node",
            name="not_ready_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
