from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0016_admin_pages"),
    ]

    operations = [
        migrations.AddField(
            model_name="nodeprovision",
            name="namespace",
            field=models.CharField(blank=True, max_length=63),
        ),
    ]
