"""The claimer side of a pod: the run loop (:mod:`.loop`), the planner (queue rotation,
batch size, per-pod reservation), the runner (claims, batches, take-over of a peer's
waiting job), the executor (runs a handler, decides its outcome), the completer (batched
fenced writes), its connection, and the process entry point (:mod:`.process`)."""

from .executor import TIMEOUT, UNKNOWN_TASK
from .loop import Claimer
from .process import ClaimerSpec, claimer_main

__all__ = ["TIMEOUT", "UNKNOWN_TASK", "Claimer", "ClaimerSpec", "claimer_main"]
