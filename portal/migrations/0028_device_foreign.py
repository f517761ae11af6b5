from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0027_pool_sharing_engine"),
    ]

    operations = [
        migrations.AddField(
            model_name="device",
            name="foreign",
            field=models.BooleanField(default=False),
        ),
    ]
