"""The Django application config of pgworker.contrib.django."""

from __future__ import annotations

from django.apps import AppConfig


class PgworkerConfig(AppConfig):
    name = "pgworker.contrib.django"
    label = "pgworker"
    verbose_name = "pgworker"
