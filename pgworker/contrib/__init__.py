"""Integrations with other libraries, each importing its library only when used:
:mod:`pgworker.contrib.sqlalchemy` (enqueue inside a SQLAlchemy transaction)."""
