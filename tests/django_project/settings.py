"""Settings of the test Django project: the database of $SHOP_DSN (a libpq
string), pgworker's jobs and Django's own tables in the schema $SHOP_SCHEMA."""

import os

import psycopg

_info = psycopg.conninfo.conninfo_to_dict(os.environ["SHOP_DSN"])
SCHEMA = os.environ["SHOP_SCHEMA"]

SECRET_KEY = "test-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost"]
USE_TZ = True
ROOT_URLCONF = "shop.urls"
INSTALLED_APPS = ["pgworker.contrib.django", "shop"]
MIDDLEWARE: list[str] = []
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _info.get("dbname", "test"),
        "USER": _info.get("user", "postgres"),
        "PASSWORD": _info.get("password", ""),
        "HOST": _info.get("host", "127.0.0.1"),
        "PORT": _info.get("port", "5432"),
        "OPTIONS": {"options": f"-c search_path={SCHEMA}"},
    }
}
PGWORKER = {"SCHEMA": SCHEMA, "APP": os.environ.get("SHOP_WORKER_APP")}
