"""Integrations with other libraries, each importing its library only when used:
:mod:`pgworker.contrib.sqlalchemy` (enqueue inside a SQLAlchemy transaction) and
:mod:`pgworker.contrib.django` (a Django app: settings, enqueue in ``transaction.atomic()``,
``manage.py pgworker``)."""
