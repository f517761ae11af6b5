from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0026_team_retire"),
    ]

    operations = [
        migrations.AddField(
            model_name="device",
            name="foreign",
            field=models.BooleanField(default=False),
        ),
    ]
