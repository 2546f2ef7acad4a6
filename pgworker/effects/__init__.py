"""Effects that happen once: a handler's own transaction committed with its fenced
completion (:mod:`.transaction`), on connections of the claimer's own (:mod:`.connections`).
See docs/effects.md for the guarantees and the crash timelines."""
