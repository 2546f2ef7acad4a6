"""The files of prometheus_client's multiprocess mode under ``pgworker run``: what /metrics
merges, and what happens to a claimer's files when it is gone.

Every process writes its values to files of its own in ``PROMETHEUS_MULTIPROC_DIR``
(``counter_<pid>.db``, ``histogram_<pid>.db``, ``gauge_<mode>_<pid>.db``), and a scrape
merges every file. ``mark_process_dead(pid)`` removes a gone process's live gauges only
(``livesum``, ``livemin``, ...): its counters and histograms must stay, or totals would
go backwards. A pod that recycles its claimers (``--max-jobs-per-child``) therefore kept
three files per process it ever started (51 files from 17 processes after 15 jobs), and
every scrape merged them all.

:func:`process_gone` merges a gone process's counters, histograms and aggregating gauges
(``max``, ``min``, ``sum``) into one compacted file per kind (``counter_compacted.db``,
...), with prometheus_client's own merge (``MultiProcessCollector.merge(files,
accumulate=False)``, the form its documentation gives for writing merged values back to
files) and its own file format (``MmapedDict``, ``mmap_key``): each sample is the sum
(or max, min) of the same sample in both files, so every total after the merge is the
total before it. The directory then holds the live processes' files and at most one
compacted file per kind. Files of other gauge modes (``all``, ``mostrecent``) are left
alone: merging them would lose their pid label or their timestamps (pgworker has none).

The merge and the scrape (:func:`exposition_collector`) take one lock, so a scrape never
sees a value in both the compacted file and the gone process's file, nor in neither.
Both run in the supervisor, the only process that serves /metrics and learns that a
claimer is gone. A claimer's pid cannot be reused by a new claimer before its files are
merged: the supervisor merges them before it starts the replacement.
"""

from __future__ import annotations

import glob
import logging
import os
import threading
from typing import Any, Iterable

log = logging.getLogger("pgworker.metrics")

COMPACTED = "compacted"
# file prefixes whose values merge by adding up (counters, histograms) or by max/min/sum
MERGED_PREFIXES = ("counter", "histogram", "summary", "gauge_max", "gauge_min", "gauge_sum")

_files_lock = threading.Lock()


def multiproc_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")


def process_gone(pid: int, path: str | None = None) -> None:
    """A process of the pod has exited: remove its live gauges (``mark_process_dead``) and
    merge its other values into the compacted files. Never raises: a failure is logged
    and the process's files stay (its totals with them)."""
    from prometheus_client import multiprocess

    path = path or multiproc_dir()
    if not path:
        return
    with _files_lock:
        multiprocess.mark_process_dead(pid, path)
        for prefix in MERGED_PREFIXES:
            dead = os.path.join(path, f"{prefix}_{pid}.db")
            if not os.path.exists(dead):
                continue
            try:
                _merge_into_compacted(path, prefix, dead)
            except Exception as exc:  # noqa: BLE001 - the values stay where they are
                log.warning("could not merge the metrics file %s into %s_%s.db: %s", dead, prefix, COMPACTED,
                            exc)


def _merge_into_compacted(path: str, prefix: str, dead: str) -> None:
    from prometheus_client.mmap_dict import MmapedDict, mmap_key
    from prometheus_client.multiprocess import MultiProcessCollector

    compacted = os.path.join(path, f"{prefix}_{COMPACTED}.db")
    sources = [f for f in (compacted, dead) if os.path.exists(f) and os.path.getsize(f) > 0]
    if sources:
        # the new file is written beside the old one under a name no scrape reads
        # (*.db only), then takes its place
        partial = compacted + ".partial"
        if os.path.exists(partial):
            os.remove(partial)
        out = MmapedDict(partial)
        try:
            for metric in MultiProcessCollector.merge(sources, accumulate=False):
                for sample in metric.samples:
                    key = mmap_key(metric.name, sample.name, list(sample.labels), list(sample.labels.values()),
                                   metric.documentation)
                    out.write_value(key, sample.value, 0.0)
        finally:
            out.close()
        os.replace(partial, compacted)
    os.remove(dead)


def exposition_collector(registry: Any) -> Any:
    """prometheus_client's MultiProcessCollector for /metrics, registered in ``registry``:
    it takes the lock of :func:`process_gone`, and reads only the ``.db`` files that have
    been created: ``MmapedDict`` creates a process's file before it sizes it, so a scrape in
    that window read a 0-byte file, raised ``struct.error`` and failed whole with a 500 (a
    claimer starting, restarted or recycled while /metrics is scraped; client_python issue
    #1199, unfixed in 0.26). An empty file holds no samples yet; skipping it loses none."""
    from prometheus_client import multiprocess

    class PodFilesCollector(multiprocess.MultiProcessCollector):
        def collect(self) -> Iterable[Any]:
            with _files_lock:
                files = []
                for path in glob.glob(os.path.join(self._path, "*.db")):
                    try:
                        if os.path.getsize(path) > 0:
                            files.append(path)
                    except OSError:  # removed since the glob (a dead process's live gauges)
                        pass
                return self.merge(files, accumulate=True)

    return PodFilesCollector(registry)
