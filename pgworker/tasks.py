"""Tasks: named handlers registered with ``@app.task``."""

from __future__ import annotations

import dataclasses
import functools
import datetime
import inspect
import math
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar, Unpack, overload

from .config import DEFAULT_QUEUE, MAX_SETTING_SECONDS
from .enqueue_options import AsyncEnqueueOptions, EnqueueOptions
from .errors import ConfigError, InvalidJob, InvalidPayload, PayloadError
from .jobs import UndecodablePayload, safe_json_loads
from .names import check_new_queue_name, check_task_name
from .payloads import (PayloadValidationError, decoder_for, expects_object, is_checked_scalar, is_payload_type,
                       not_an_object, payload_annotation, payload_has_default, scalar_decoder, type_name)
from .retry import RetryPolicy

if TYPE_CHECKING:
    from typing import Protocol

    from .context import JobContext

    class Enqueuer(Protocol):
        """What a task bound to an App calls for ``task.enqueue()``: the App's enqueue calls
        (a protocol, so that this module, below the App, does not import it)."""

        # (*args: Any, **kwargs: Any): mypy reads it as "any signature", the App's keyword options included
        def enqueue(self, *args: Any, **kwargs: Any) -> int: ...

        async def aenqueue(self, *args: Any, **kwargs: Any) -> int: ...

# Dead-head policy of per-key ordering: does a dead job keep its ordering key blocked?
ORDERING_ON_DEAD = {"block": True, "skip": False}
RENEW_WHILE_ALIVE = "alive"
RENEW_ON_PROGRESS = "progress"
DEFAULT_MAX_ATTEMPTS = 5
PRIORITY_MIN, PRIORITY_MAX = -32768, 32767

# The payload type of a task, read by type checkers from the handler's first parameter
# (``@app.task`` on ``def bill(inv: Invoice)`` gives a ``Task[Invoice]``, whose
# ``enqueue`` takes an Invoice). Contravariant, as a parameter type is: a ``Task[Invoice |
# None]`` may be enqueued as a ``Task[None]`` is, with no payload.
PayloadT = TypeVar("PayloadT", contravariant=True)
_P = TypeVar("_P")

if TYPE_CHECKING:
    class TaskDecorator(Protocol):
        """What ``@app.task(name=...)`` returns: applied to a handler, its ``Task[P]``
        (``P`` the handler's payload parameter's type, with or without the context)."""

        # `object` returns and no `Callable[..., Any]` fallback: see App.task's overloads
        @overload
        def __call__(self, func: Callable[[_P], object], /) -> Task[_P]: ...

        @overload
        def __call__(self, func: Callable[[_P, JobContext], object], /) -> Task[_P]: ...


@dataclass(frozen=True)
class Task(Generic[PayloadT]):
    """A registered handler and how its jobs run; ``Task[P]`` for type checkers, ``P``
    the type of the handler's payload parameter (``Task[Any]`` when it has none).

    ``timeout_seconds``: an attempt running longer fails with code TIMEOUT (async
    handlers are cancelled; a sync handler's claimer process is replaced).
    ``max_runtime_seconds``: the lease is not renewed past this age (None: the worker's
    setting). ``renew``: 'alive' renews the lease while the claimer process lives (up to
    the max runtime); 'progress' only while the handler reported progress within the last
    lease (``ctx.heartbeat()``). ``permanent_errors``: exception types that skip retries.
    ``payload_type``: a callable that decodes the payload; a dataclass, TypedDict or
    pydantic model (given here, or the annotation of the handler's payload parameter) is
    decoded and checked field by field (:mod:`pgworker.payloads`). A failure to decode
    ends the job dead at once with code PAYLOAD_INVALID and the failure's message.
    ``ordering_on_dead``: what a dead job does to its ordering key: 'block' (the key's
    later jobs wait until it is replayed or discarded) or 'skip' (they go on).
    ``dedupe_window_seconds``: how long after success a job keeps its dedupe key held
    (None: the key is free again as soon as the job succeeds). See docs/scheduling.md.
    """

    name: str
    func: Callable[..., Any]
    queue: str = DEFAULT_QUEUE
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout_seconds: float | None = None
    max_runtime_seconds: float | None = None
    renew: str = RENEW_WHILE_ALIVE
    priority: int = 0
    permanent_errors: tuple[type[BaseException], ...] = ()
    payload_type: Callable[..., Any] | None = None
    ordering_on_dead: str = "block"
    dedupe_window_seconds: float | None = None
    app: "Enqueuer | None" = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_task_name(self.name)
        check_new_queue_name(self.queue)
        check_max_attempts(self.max_attempts)
        check_priority(self.priority)
        _check_seconds(self.name, "timeout", self.timeout_seconds)
        _check_seconds(self.name, "max_runtime", self.max_runtime_seconds)
        if self.renew not in (RENEW_WHILE_ALIVE, RENEW_ON_PROGRESS):
            raise ConfigError(f"task {self.name!r}: renew must be 'alive' or 'progress'")
        check_ordering_on_dead(self.ordering_on_dead)
        check_dedupe_window(self.dedupe_window_seconds)
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError(f"task {self.name!r}: retry must be a pgworker.RetryPolicy, e.g. "
                              f"retry=pgworker.RetryPolicy(base_seconds=5); got {self.retry!r} "
                              "(the number of attempts is max_attempts=)")
        self._check_signature()

    def _check_signature(self) -> None:
        """The handler must take the payload (and may take the context): one that takes
        neither was accepted here and failed every attempt of every job with a TypeError."""
        try:
            signature = inspect.signature(self.func)
        except (TypeError, ValueError):  # no signature to read (a builtin): the call decides
            return
        for args in ((None, None), (None,)):
            try:
                signature.bind(*args)
                return
            except TypeError:
                continue
        raise ConfigError(f"task {self.name!r}: the handler {getattr(self.func, '__name__', self.func)}{signature} "
                          "cannot be called as handler(payload) or handler(payload, ctx): take the payload, "
                          "optionally the pgworker.JobContext, and give any other parameter a default")

    # Cached: the claimer asks for every job, and inspect.signature costs ~20 us a call.
    @functools.cached_property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    @functools.cached_property
    def takes_context(self) -> bool:
        """Whether the handler takes a second argument (the :class:`JobContext`)."""
        try:
            params = [p for p in inspect.signature(self.func).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            return True
        return len(params) >= 2

    @functools.cached_property
    def _annotation(self) -> Any:
        """The resolved annotation of the handler's payload parameter, or None (read once:
        a name that cannot be resolved is logged once, not at every use)."""
        return payload_annotation(self.func)

    @functools.cached_property
    def typed_decoder(self) -> Callable[[Any], Any] | None:
        """The checking decoder of a dataclass, TypedDict or pydantic payload type: the
        ``payload_type`` given, else the annotation of the handler's payload parameter
        (:mod:`pgworker.payloads`); None for any other (or no) type."""
        tp = self.payload_type if self.payload_type is not None else self._annotation
        return decoder_for(tp) if is_payload_type(tp) else None  # type: ignore[arg-type]

    @functools.cached_property
    def _scalar_checker(self) -> Callable[[Any], Any] | None:
        """The check of a plain JSON value type annotated on the handler's payload parameter
        (``int``, ``str``, ``None``, a ``Literal``, an ``Enum``, a union of these and payload
        types: :func:`pgworker.payloads.is_checked_scalar`), run at enqueue only: a worker
        passes a stored payload to such a handler as it is, as it always has (a break-it
        trial: jobs queued by an older producer, 3.0 for an ``int``, ``{}`` for ``None``, would
        have gone dead after an upgrade). None for a parameter with a default (optional)."""
        if self.payload_type is not None or self._annotation is None or payload_has_default(self.func):
            return None
        return scalar_decoder(self._annotation) if is_checked_scalar(self._annotation) else None

    @functools.cached_property
    def payload_check(self) -> Callable[[str], None] | None:
        """What enqueue checks of this task's payloads (their JSON text, as stored), decided
        once per task: None (no annotation, ``Any``, a ``payload_type`` callable: nothing,
        at no cost), the typed decode the worker runs (a dataclass, TypedDict or pydantic
        type), or that the text is a JSON object (annotated ``dict`` or ``Mapping``). The
        check raises :class:`PayloadError` for a payload a worker is certain to refuse.

        Cached at the first use, not at ``@app.task``: with ``from __future__ import
        annotations`` the payload type may be defined below its handler, and resolves only
        once the module has run (the worker's ``typed_decoder`` is read as late)."""
        if self.typed_decoder is not None:
            return self._check_typed
        if self.payload_type is None and expects_object(self._annotation):
            return self._check_object
        if self._scalar_checker is not None:
            return self._check_scalar
        return None

    def _check_scalar(self, text: str) -> None:
        assert self._scalar_checker is not None  # chosen by payload_check
        try:
            self._scalar_checker(safe_json_loads(text))
        except PayloadValidationError as exc:
            name = type_name(self._annotation)
            raise PayloadError(f"task {self.name!r}: {exc}; nothing was enqueued: give the payload the shape of "
                               f"{name}, the annotation of the handler's payload parameter (a handler annotated "
                               "this way would get it as it is, and fail on it)") from None

    def _check_typed(self, text: str) -> None:
        try:
            self.decode(safe_json_loads(text))  # the worker's decode of the stored JSON, as it will run it
        except InvalidPayload as exc:
            tp = self.payload_type if self.payload_type is not None else self._annotation
            name = getattr(tp, "__name__", tp)
            raise PayloadError(f"{exc}; nothing was enqueued: give the payload the shape of {name}, the "
                               f"payload type of the task's handler ({name} instance, or its fields as a "
                               "dict); a worker would end this job dead with PAYLOAD_INVALID") from None
        except Exception:  # noqa: BLE001 - the type's own code failing otherwise (__post_init__): the
            return  # worker would retry it as a handler error, not refuse it for certain; enqueue as before

    def _check_object(self, text: str) -> None:
        if text.startswith("{"):  # compact JSON of an object (the encoder adds no leading space)
            return
        if text == "null" and payload_has_default(self.func):  # `payload: dict = None`: no payload is fine
            return
        raise PayloadError(f"task {self.name!r}: {not_an_object(json.loads(text), self._annotation)}; nothing was "
                           "enqueued: pass a dict (a JSON object), as the annotation of the handler's payload "
                           "parameter says, or annotate it otherwise (Any, or none) to take other JSON values")

    def decode(self, payload: Any) -> Any:
        """The payload as the handler wants it; raises :class:`InvalidPayload` (the job then
        goes dead at once with PAYLOAD_INVALID) when it does not fit the payload type."""
        if isinstance(payload, UndecodablePayload):
            raise InvalidPayload(f"task {self.name!r}: the stored payload cannot be decoded: {payload.reason} "
                                 f"({payload.size} bytes); fix the producer, then replay or cancel the job")
        typed = self.typed_decoder
        if typed is not None:
            try:
                return typed(payload)
            except PayloadValidationError as exc:
                raise InvalidPayload(f"task {self.name!r}: {exc}") from None
        if self.payload_type is None:
            return payload
        try:
            if isinstance(payload, dict) and dataclasses.is_dataclass(self.payload_type):
                return self.payload_type(**payload)
            return self.payload_type(payload)
        except Exception as exc:
            raise InvalidPayload(
                f"task {self.name!r} cannot decode its payload as "
                f"{getattr(self.payload_type, '__name__', self.payload_type)}: {type(exc).__name__}: {exc}") from exc

    @overload
    def enqueue(self: "Task[None]", payload: None = None, **options: Unpack[EnqueueOptions]) -> int: ...

    @overload
    def enqueue(self, payload: PayloadT, **options: Unpack[EnqueueOptions]) -> int: ...

    def enqueue(self, payload: Any = None, **options: Unpack[EnqueueOptions]) -> int:
        """Enqueue a job of this task; see :meth:`pgworker.App.enqueue` (the same keyword
        options, typed: :class:`pgworker.enqueue_options.EnqueueOptions`). ``payload``: of
        the handler's payload type, for type checkers (an ``Invoice`` for ``def bill(inv:
        Invoice)``; a payload of another type is refused by ``mypy``; at run time it is
        checked as ``App.enqueue`` checks it); omitted only where the handler takes None."""
        if self.app is None:
            raise ConfigError(f"task {self.name!r} is not bound to an App")
        return self.app.enqueue(self, payload, **options)

    @overload
    async def aenqueue(self: "Task[None]", payload: None = None, **options: Unpack[AsyncEnqueueOptions]) -> int: ...

    @overload
    async def aenqueue(self, payload: PayloadT, **options: Unpack[AsyncEnqueueOptions]) -> int: ...

    async def aenqueue(self, payload: Any = None, **options: Unpack[AsyncEnqueueOptions]) -> int:
        """Enqueue a job of this task from asyncio; see :meth:`pgworker.App.aenqueue`
        (``payload`` typed as :meth:`enqueue`'s)."""
        if self.app is None:
            raise ConfigError(f"task {self.name!r} is not bound to an App")
        return await self.app.aenqueue(self, payload, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handler directly (tests, local use)."""
        return self.func(*args, **kwargs)


def retry_delays(tasks: dict[str, Task[Any]], override: RetryPolicy | None = None) -> Callable[[str, int], float]:
    """``delay(task_name, attempts)``: seconds before a job of that task retries after its
    attempt number ``attempts`` failed, by the task's retry policy (the default policy for
    a task this process does not know), or by ``override`` for every task. The reaper
    uses it for expired leases, so a job retries on one policy however its attempt ended."""
    default = RetryPolicy()

    def delay(task_name: str, attempts: int) -> float:
        if override is not None:
            return override.delay(attempts)
        task = tasks.get(task_name)
        return (task.retry if task is not None else default).delay(attempts)

    return delay


def _check_seconds(task: str, option: str, value: object) -> None:
    """A task's time limit: None, or seconds as a finite number in (0, 100 years];
    raises :class:`ConfigError` naming the option and the fix."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= MAX_SETTING_SECONDS:
        hint = " (a number, not a duration string)" if isinstance(value, str) else ""
        raise ConfigError(f"task {task!r}: {option} must be seconds{hint}, a number above 0 and at most "
                          f"100 years, e.g. {option}=30; got {value!r}")


def check_max_attempts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidJob(f"max_attempts must be an integer >= 1, got {value!r}")
    if value > 1_000_000:
        raise InvalidJob(f"max_attempts must be <= 1000000, got {value!r}")
    return value


def check_priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidJob(f"priority must be an integer between {PRIORITY_MIN} and {PRIORITY_MAX} "
                          f"(higher runs first), got {value!r}")
    return value


def check_ordering_on_dead(value: object) -> str:
    if value not in ORDERING_ON_DEAD:
        raise InvalidJob(f"ordering_on_dead must be 'block' (a dead job holds its ordering key until it "
                         f"is replayed or discarded) or 'skip' (the key's next job runs), got {value!r}")
    return value


def check_dedupe_window(value: object) -> float | None:
    """Seconds (a number or a timedelta) after success during which a dedupe key stays held;
    raises :class:`InvalidJob` outside (0, 100 years]."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= 100 * 365 * 86400:
        raise InvalidJob(f"dedupe_window must be seconds (or a timedelta) between 0 and 100 years, "
                         f"exclusive of 0, got {value!r}")
    return float(value)
