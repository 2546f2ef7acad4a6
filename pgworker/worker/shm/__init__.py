"""The pod's shared memory: what a claimer and its supervisor (and the claimer's peers)
read and write without a query.

- :mod:`.layout`: the ctypes layout of a slot and of a table's header, the slot states,
  and the copies (:class:`~.layout.SlotView`) the readers take;
- :mod:`.slots`: the slot state machine, :class:`~.slots.SlotTable` (one per claimer);
- :mod:`.header`: the header's writers and readers (loop beat, outcome counts, write health);
- :mod:`.wakeups`: the pod's work generation and the one-idle-claimer wake-up;
- :mod:`.lock`: the ``flock`` that guards a table and that a killed holder cannot keep.
"""
