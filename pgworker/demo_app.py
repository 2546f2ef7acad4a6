"""The tasks of ``pgworker demo``: real work with real side effects.

* ``render_tile``: renders a Mandelbrot tile (CPU work) and writes it as a PGM image,
  atomically, named after the job's idempotency key, so a re-run after a crash
  overwrites the same file instead of adding one.
* ``deliver_webhook``: POSTs an event to a local HTTP endpoint with an
  ``Idempotency-Key`` header. The endpoint answers 503 now and then (a transient
  failure: retried with backoff) and 422 for events it cannot accept (permanent: dead).
* ``summarize_text``: counts words in a generated document and writes a JSON report.
  Its payload is decoded into a dataclass; a payload that does not fit ends dead with
  PAYLOAD_INVALID instead of being retried.

* ``charge_invoice``: totals an invoice in a durable step (``ctx.step``: computed once
  across attempts) and charges it at a local payment endpoint as an external effect
  (``ctx.effect``) with an idempotency key. The endpoint takes the first charge of each
  invoice and then "loses" its reply (503): the next attempt finds the charge started
  and unfinished, asks the endpoint (``reconcile``) and goes on without charging again.

Settings come from the environment because claimers are separate processes:
``PGWORKER_DEMO_DIR`` (output folder) and ``PGWORKER_DEMO_URL`` (the endpoint).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass

import pgworker

app = pgworker.App(name="pgworker-demo")
FAST_RETRY = pgworker.RetryPolicy(base_seconds=0.2, factor=2.0, max_seconds=2.0, jitter=0.5)


def _out(*parts: str) -> str:
    path = os.path.join(os.environ.get("PGWORKER_DEMO_DIR", "."), *parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


@app.task(name="render_tile", queue="images", max_attempts=3, retry=FAST_RETRY)
def render_tile(payload: dict, ctx: pgworker.JobContext) -> None:
    size = int(payload.get("size", 48))
    cx, cy, zoom = float(payload["x"]), float(payload["y"]), float(payload.get("zoom", 1.0))
    rows = []
    for py in range(size):
        row = bytearray()
        for px in range(size):
            c = complex(cx + (px - size / 2) / (size * zoom), cy + (py - size / 2) / (size * zoom))
            z, n = 0j, 0
            while abs(z) <= 2 and n < 60:
                z, n = z * z + c, n + 1
            row.append(255 - n * 4)
        rows.append(bytes(row))
        if py % 16 == 0:
            ctx.heartbeat(py / size)
    image = f"P5 {size} {size} 255\n".encode() + b"".join(rows)
    _write_atomic(_out("tiles", f"{ctx.idempotency_key}.pgm"), image)


@app.task(name="deliver_webhook", queue="webhooks", max_attempts=4, retry=FAST_RETRY, timeout=10)
def deliver_webhook(payload: dict, ctx: pgworker.JobContext) -> None:
    req = urllib.request.Request(
        os.environ["PGWORKER_DEMO_URL"], data=json.dumps(payload).encode(), method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": ctx.idempotency_key,
                 "X-Attempt": str(ctx.attempt)})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 422:
            raise pgworker.Permanent(f"endpoint refused event {payload.get('event_id')}: 422",
                                     code="WEBHOOK_REJECTED") from None
        raise  # 5xx: transient, retried with backoff


@dataclass(frozen=True)
class TextJob:
    doc: str
    words: int


@app.task(name="summarize_text", queue="default", max_attempts=3, retry=FAST_RETRY, payload_type=TextJob)
def summarize_text(job: TextJob, ctx: pgworker.JobContext) -> None:
    vocabulary = ["lease", "token", "claim", "fence", "queue", "retry", "backoff", "jitter", "reaper", "worker"]
    words = [vocabulary[(i * 7 + len(job.doc)) % len(vocabulary)] for i in range(job.words)]
    counts = Counter(words)
    report = {"doc": job.doc, "words": job.words, "top": counts.most_common(3)}
    _write_atomic(_out("reports", f"{ctx.idempotency_key}.json"), json.dumps(report).encode())


def _charges_url(key: str = "") -> str:
    return os.environ["PGWORKER_DEMO_URL"].rsplit("/", 1)[0] + "/charges" + (f"/{key}" if key else "")


def _charge(key: str, cents: int) -> dict:
    req = urllib.request.Request(_charges_url(), data=json.dumps({"cents": cents}).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Idempotency-Key": key})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def _find_charge(key: str) -> object:
    """Ask the payment endpoint whether the charge with this key was made."""
    try:
        with urllib.request.urlopen(_charges_url(key), timeout=5) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return pgworker.NOT_DONE
        raise


@app.task(name="charge_invoice", queue="webhooks", max_attempts=4, retry=FAST_RETRY, timeout=10)
def charge_invoice(payload: dict, ctx: pgworker.JobContext) -> None:
    cents = ctx.step("total", lambda: sum(int(line["cents"]) * int(line.get("qty", 1)) for line in payload["lines"]))
    ctx.effect("charge", lambda key: _charge(key, cents), reconcile=_find_charge)


@app.task(name="tile_stats", queue="images", max_attempts=3, retry=FAST_RETRY)
def tile_stats(payload: dict, ctx: pgworker.JobContext) -> dict:
    """A part of the demo's small graph: how many points of a tile are in the set (its result)."""
    size, inside = int(payload.get("size", 24)), 0
    for py in range(size):
        for px in range(size):
            c = complex(float(payload["x"]) + (px - size / 2) / size, float(payload["y"]) + (py - size / 2) / size)
            z, n = 0j, 0
            while abs(z) <= 2 and n < 40:
                z, n = z * z + c, n + 1
            inside += n == 40
    return {"tile": payload["name"], "inside": inside, "points": size * size}


@app.task(name="mosaic", queue="default", max_attempts=3, retry=FAST_RETRY)
def mosaic(payload: dict, ctx: pgworker.JobContext) -> dict:
    """The graph's callback: runs once every tile_stats job succeeded, from their results."""
    parts = list(ctx.parent_results().values())
    return {"tiles": len(parts), "inside": sum(p["inside"] for p in parts),
            "points": sum(p["points"] for p in parts)}
