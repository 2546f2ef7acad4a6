"""A Django view enqueueing inside its transaction.atomic() block on Django's connection."""

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse

from pgworker.contrib import django as pgworker_django


class Refused(Exception):
    pass


def create_order(request: HttpRequest) -> JsonResponse:
    item = request.POST["item"]
    try:
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("INSERT INTO orders (item) VALUES (%s) RETURNING id", [item])
                order_id = cur.fetchone()[0]
            job_id = pgworker_django.enqueue("record", {"order": order_id}, any_task=True)
            if request.POST.get("refuse"):
                raise Refused  # after the enqueue: the order and its job roll back together
    except Refused:
        return JsonResponse({"refused": True}, status=409)
    return JsonResponse({"order": order_id, "job": job_id})


def job_status(request: HttpRequest, job_id: int) -> JsonResponse:
    job = pgworker_django.get_app().get_job(job_id)
    return JsonResponse({"state": job["state"] if job else None})
