# A pool declares what shares its GPUs between slices (none, time-slicing, mps, hami).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("portal", "0026_team_retire")]

    operations = [
        migrations.AddField(
            model_name="pool",
            name="sharing_engine",
            field=models.CharField(
                choices=[
                    ("none", "None"),
                    ("time-slicing", "Time Slicing"),
                    ("mps", "Mps"),
                    ("hami", "Hami"),
                ],
                default="none",
                max_length=20,
            ),
        ),
    ]
