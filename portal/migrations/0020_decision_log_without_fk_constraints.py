# The decision log keeps its foreign keys in the ORM only (see Decision).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0019_profile_starving_loss_ratio"),
    ]

    operations = [
        migrations.AlterField(
            model_name="decision",
            name="attempt",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                to="portal.attempt",
            ),
        ),
        migrations.AlterField(
            model_name="decision",
            name="pool",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                to="portal.pool",
            ),
        ),
        migrations.AlterField(
            model_name="decision",
            name="request",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="decisions",
                to="portal.gpurequest",
            ),
        ),
        migrations.AlterField(
            model_name="decision",
            name="team",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                to="portal.team",
            ),
        ),
    ]
