"""Personal access tokens (hashed) and idempotency keys; DRF's authtoken keys become tokens.

Each `authtoken_token` key is kept working as a personal token (its sha256 stored, scope
`admin` for staff users, `read+submit` otherwise, expiring PERSONAL_TOKEN_DAYS from now, named
so that its owner recognises it); then the old table, which kept keys in clear, is dropped.
"""

import hashlib
from datetime import timedelta
from typing import Any

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils import timezone

OLD_TABLE = "authtoken_token"


def adopt_drf_tokens(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if OLD_TABLE not in connection.introspection.table_names():
        return
    PersonalToken = apps.get_model("portal", "PersonalToken")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    staff = set(User.objects.filter(is_staff=True).values_list("pk", flat=True))
    expires = timezone.now() + timedelta(days=settings.PERSONAL_TOKEN_DAYS)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT key, user_id FROM {OLD_TABLE}")
        rows = cursor.fetchall()
    for key, user_id in rows:
        PersonalToken.objects.get_or_create(
            digest=hashlib.sha256(key.encode()).hexdigest(),
            defaults={
                "user_id": user_id,
                "name": "API token from before personal tokens (replace it)",
                "prefix": key[:8],
                "scope": "admin" if user_id in staff else "read+submit",
                "expires_at": expires,
            },
        )
    schema_editor.execute(f"DROP TABLE {OLD_TABLE}")
    schema_editor.execute("DELETE FROM django_migrations WHERE app = 'authtoken'")


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0022_ledger_without_fk_constraints"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="PersonalToken",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=100)),
                ("prefix", models.CharField(max_length=16)),
                ("digest", models.CharField(max_length=64, unique=True)),
                (
                    "scope",
                    models.CharField(
                        choices=[
                            ("read", "read"),
                            ("read+submit", "read and submit"),
                            ("admin", "admin"),
                        ],
                        default="read+submit",
                        max_length=16,
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("expires_at", models.DateTimeField()),
                ("last_used_at", models.DateTimeField(blank=True, null=True)),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="personal_tokens",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "ordering": ["-created_at", "-id"],
            },
        ),
        migrations.CreateModel(
            name="IdempotencyKey",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(max_length=255)),
                ("fingerprint", models.CharField(max_length=64)),
                ("status_code", models.PositiveSmallIntegerField(default=0)),
                ("body", models.JSONField(blank=True, null=True)),
                ("created_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("user", "key"), name="idempotency_key_one_per_user"
                    )
                ],
            },
        ),
        migrations.RunPython(adopt_drf_tokens, migrations.RunPython.noop),
    ]
