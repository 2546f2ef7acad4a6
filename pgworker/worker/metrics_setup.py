"""The metrics of a pod process (the supervisor and each claimer), set up one way."""

from __future__ import annotations

from typing import Any, Sequence


def pod_metrics(app: Any, queues: Sequence[str], task_label: bool) -> Any:
    """This process's :func:`pgworker.metrics.process_metrics`, with every queue of the pod
    and every task of ``app`` known from the start (their series exist at zero rather than
    appearing with the first job)."""
    from ..metrics import process_metrics  # the registry and its multiprocess files load on first use

    metrics = process_metrics(task_label=task_label)
    tasks_by_queue: dict[str, list[str]] = {}
    for t in app.tasks.values():
        tasks_by_queue.setdefault(t.queue, []).append(t.name)
    metrics.init_queues(list(queues), tasks_by_queue)
    metrics.known_tasks(app.tasks)
    return metrics
