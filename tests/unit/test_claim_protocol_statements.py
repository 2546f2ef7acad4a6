"""Every statement that writes or locks job rows follows the claim-floor protocol of
migration 0013 (docs/architecture.md, "Claim floors"), or says why it need not.

A statement that makes a job claimable must stamp its run_at with ``claim_stamp`` (or
bump the epoch with ``claim_backdate`` when the run_at is older), and one that locks a
claimable job without changing it must bump the epoch: otherwise a claimer's floor may
pass that job. The behaviour is tested in tests/integration/test_claim_floors.py; this
test fails on a new statement that touches jobs and is in neither list below, so that
its author decides which it is.
"""

from __future__ import annotations

import re

from pgworker import sql as sqlfiles

TOUCHES_JOBS = re.compile(r"INSERT INTO \{schema\}\.jobs\b|UPDATE \{schema\}\.jobs\b|"
                          r"\bFOR (NO KEY )?UPDATE\b|\bFOR (KEY )?SHARE\b", re.I)

# statement -> why it leaves no job claimable below a floor without the protocol
EXEMPT = {
    "job_claim": "the claim itself: it takes what it locks, and returns the horizon",
    "job_cancel": "a pending job it locks ends cancelled (a running one gets a request)",
    "job_cancel_finish": "running jobs only, to cancelled",
    "job_complete": "running jobs to succeeded; the children it locks wait for this parent (blocked), "
                    "and the dependency trigger bumps the epoch of those it unblocks",
    "job_effect_done": "a running job of the handler's own",
    "job_step_record": "a running job of the handler's own",
    "job_progress": "a running job of the handler's own",
    "job_renew": "running jobs only",
    "job_renew_skip_locked": "running jobs only",
    "job_take_over": "a running job only",
    "job_reap_failure_note": "a running job only",
    "jobs_reap_candidates": "running jobs only",
    "jobs_prune": "finished jobs only",
    "dedupe_holders": "succeeded jobs only",
    "jobs_insert_many": "run_at from job_ids_allocate's claim_stamp, in the same transaction; "
                        "the caller bumps the epoch for a run_at given in the past (producer._keyed_plan)",
    "jobs_insert_graph": "run_at from job_ids_allocate's claim_stamp, in the same transaction; "
                         "the caller bumps the epoch for a run_at given in the past (dependencies.enqueue_graph)",
}


def _body(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith("--"))


def test_every_statement_that_touches_jobs_follows_the_protocol_or_says_why_not():
    touching = {name: _body(text) for name, text in sqlfiles.query_templates().items()
                if "{schema}.jobs" in _body(text) and TOUCHES_JOBS.search(_body(text))}
    unexplained = sorted(name for name, body in touching.items()
                         if name not in EXEMPT and "claim_stamp" not in body and "claim_backdate" not in body)
    assert not unexplained, (f"{unexplained} write or lock job rows without claim_stamp or claim_backdate "
                             "(migration 0013): follow the protocol, or add the statement to EXEMPT with why")
    assert set(EXEMPT) <= set(touching), f"EXEMPT names statements that no longer touch jobs: {set(EXEMPT) - set(touching)}"


def test_the_bulk_paths_take_the_stamp_in_the_inserting_transaction():
    """COPY, jobs_insert_many and jobs_insert_graph get run_at from job_ids_allocate's
    clock, which must be claim_stamp's (the bucket locks held until the insert commits)."""
    allocate = _body(sqlfiles.query_templates()["job_ids_allocate"])
    assert "claim_stamp(%(queues)s::text[])" in allocate
