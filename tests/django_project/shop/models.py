"""The shop's orders (the table tests/integration/test_django.py creates), for handlers
that use the ORM."""

from django.db import models


class Order(models.Model):
    item = models.TextField()

    class Meta:
        app_label = "shop"
        db_table = "orders"
        managed = False
