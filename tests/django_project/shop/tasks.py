"""The shop's tasks, importing models at the top as a Django project does: a worker of
`manage.py pgworker run` must set Django up before it loads this module."""

from django.db import connection

from pgworker import App

from shop.models import Order

app = App()


@app.task(name="ship_order")
def ship_order(payload: dict[str, int]) -> int:
    order = Order.objects.get(pk=payload["order"])
    order.item = f"shipped: {order.item}"
    order.save()
    return Order.objects.count()


@app.task(name="lose_connection", max_attempts=1)
def lose_connection(payload: None) -> None:
    """The ORM's connection dies under the handler (as a PostgreSQL restart kills it)."""
    connection.ensure_connection()
    connection.connection.close()
    Order.objects.count()  # raises: the connection is closed


@app.task(name="acount_orders")
async def acount_orders(payload: None) -> int:
    return await Order.objects.acount()


@app.task(name="alose_connection", max_attempts=1)
async def alose_connection(payload: None) -> None:
    """The async ORM's connection (in asgiref's thread) dies under the handler."""
    from asgiref.sync import sync_to_async

    def lose() -> None:
        connection.ensure_connection()
        connection.connection.close()

    await sync_to_async(lose)()
    await Order.objects.acount()  # raises: the connection is closed


@app.task(name="leave_atomic_open", max_attempts=3)
def leave_atomic_open(payload: None) -> None:
    """A handler bug: it enters an atomic() block and never exits it."""
    from django.db import transaction

    transaction.atomic().__enter__()
    Order.objects.create(item="never committed")


@app.task(name="commit_by_hand", max_attempts=1)
def commit_by_hand(payload: None) -> None:
    """Django's documented manual transaction pattern: autocommit off, commit, not restored."""
    from django.db import transaction

    transaction.set_autocommit(False)
    Order.objects.create(item="committed by hand")
    transaction.commit()
