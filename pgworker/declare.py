"""The App's declarations, checked when they are made: a handler registered as a
:class:`pgworker.Task` (:meth:`pgworker.App.task`) and a periodic schedule
(:meth:`pgworker.App.periodic`). Each takes the registries it adds to, not the App."""

from __future__ import annotations

import dataclasses
import inspect
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .errors import ConfigError, PayloadError
from .payloads import resolve_annotation
from .retry import RetryPolicy
from .schedules import Periodic
from .tasks import DEFAULT_MAX_ATTEMPTS, Task, check_dedupe_window

if TYPE_CHECKING:
    from .tasks import Enqueuer


def new_task(fn: Callable[..., Any], tasks: dict[str, Task[Any]], *, name: str | None, queue: str | None,
             max_attempts: int | None, retry: RetryPolicy | None, timeout: float | None,
             max_runtime: float | None, renew: str | None, priority: int,
             permanent_errors: Sequence[type[BaseException]], payload_type: Callable[..., Any] | None,
             ordering_on_dead: str, dedupe_window: "float | timedelta | None",
             app: "Enqueuer") -> Task[Any]:
    """The :class:`Task` of handler ``fn`` (named ``name``, else module.qualname), not yet
    added to ``tasks``. Raises :class:`ConfigError` for a name ``tasks`` has or a bad option."""
    task_name = name or f"{fn.__module__}.{fn.__qualname__}".removeprefix("__main__.")
    if task_name in tasks:
        raise ConfigError(f"task {task_name!r} is registered twice; give one of them another name=")
    kwargs: dict[str, Any] = {}
    if max_attempts is not None:
        kwargs["max_attempts"] = max_attempts
    if retry is not None:
        kwargs["retry"] = retry
    if renew is not None:
        kwargs["renew"] = renew
    return Task(name=task_name, func=fn, queue="default" if queue is None else queue, timeout_seconds=timeout,
                max_runtime_seconds=max_runtime, priority=priority,
                permanent_errors=tuple(permanent_errors), payload_type=payload_type,
                ordering_on_dead=ordering_on_dead,
                dedupe_window_seconds=check_dedupe_window(dedupe_window), app=app, **kwargs)


def new_schedule(task: "str | Task[Any]", cron: str, schedules: dict[str, Periodic], tasks: dict[str, Task[Any]], *,
                 name: str | None, tz: str, missed: str, payload: Any, queue: str | None,
                 priority: int | None, max_attempts: int | None, misfire_grace: float,
                 max_payload_bytes: int) -> Periodic:
    """The checked :class:`Periodic` (see :meth:`pgworker.App.periodic`), added to ``schedules``;
    job options not given are the task's (when ``tasks`` has it). Raises :class:`ConfigError`."""
    registered = task if isinstance(task, Task) else tasks.get(task)
    task_name = task.name if isinstance(task, Task) else task
    schedule_name = name or task_name
    if schedule_name in schedules:
        raise ConfigError(f"schedule {schedule_name!r} is declared twice; give one of them name=...")
    # `is not None`, not `or`: an explicit 0 or '' is checked (and refused), not replaced
    p = Periodic(
        name=schedule_name, task=task_name, cron=cron, timezone=tz, missed=missed, payload=payload,
        queue=queue if queue is not None else (registered.queue if registered else "default"),
        priority=priority if priority is not None else (registered.priority if registered else 0),
        max_attempts=max_attempts if max_attempts is not None else (
            registered.max_attempts if registered else DEFAULT_MAX_ATTEMPTS),
        misfire_grace_seconds=misfire_grace, max_payload_bytes=max_payload_bytes,
        task_defaults=() if registered is not None else tuple(
            option for option, given in (("queue", queue), ("priority", priority), ("max_attempts", max_attempts))
            if given is None))
    if registered is not None:
        check_schedule_payload(p, registered)
    schedules[schedule_name] = p
    return p


def adopt_task(schedules: dict[str, Periodic], task: Task[Any]) -> None:
    """The schedules declared by ``task``'s name before it was registered take its job
    options where none was given (queue, priority, max_attempts: as a schedule declared
    after it does; the break-it trial: a schedule declared first kept queue 'default', and
    a worker of the task's queue never ran its jobs), and have their payload checked
    (:func:`check_schedule_payload`). Checked whole before any is changed: raises
    :class:`ConfigError` and changes nothing."""
    adopted = {name: dataclasses.replace(p, task_defaults=(), **{o: getattr(task, o) for o in p.task_defaults})
               for name, p in schedules.items() if p.task == task.name}
    for p in adopted.values():
        check_schedule_payload(p, task)
    schedules.update(adopted)


def check_schedule_payload(schedule: Periodic, task: Task[Any]) -> None:
    """Refuse a schedule whose payload its task's handler would refuse (the check enqueue
    makes: :attr:`Task.payload_check`), as :class:`ConfigError` naming the schedule: every
    slot's job would go dead at its first attempt (a trial: a `dict` handler scheduled with
    no payload). Called when the schedule is declared for a registered task, and when a
    task is registered for schedules declared before it by name. A handler's annotation
    that cannot be resolved yet (``from __future__ import annotations``, its type defined
    below the handler) is not checked here, where reading it would fix the task's decoder
    too early: the scheduler checks the payload once the app is imported whole."""
    if not _annotation_resolvable(task.func):
        return
    check = task.payload_check
    if check is None:
        return
    try:
        check(schedule._payload_json)
    except PayloadError as exc:
        fix = ("@app.task(schedule=...) enqueues no payload: declare the schedule with app.periodic(task, cron, "
               "payload=...), or let the handler take None" if schedule.payload is None
               else "give the schedule a payload= the handler takes")
        raise ConfigError(f"schedule {schedule.name!r}: {exc}; {fix}") from exc


def _annotation_resolvable(fn: Callable[..., Any]) -> bool:
    """Whether the handler's payload annotation can be read now (no string annotation
    whose names are not defined yet)."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return False
    if not params or not isinstance(params[0].annotation, str):
        return True
    try:
        resolve_annotation(fn, params[0].name, params[0].annotation)
    except Exception:  # noqa: BLE001 - not resolvable yet: checked later
        return False
    return True
