"""The claimer side of a pod: the claim loop, the executor (runs a handler, decides its
outcome), the completer (batched fenced writes) and the process entry point."""

from .executor import TIMEOUT, UNKNOWN_TASK
from .loop import Claimer
from .process import ClaimerSpec, claimer_main

__all__ = ["TIMEOUT", "UNKNOWN_TASK", "Claimer", "ClaimerSpec", "claimer_main"]
