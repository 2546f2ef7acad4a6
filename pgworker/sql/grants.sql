-- Least-privilege roles for one pgworker schema, printed or applied by
-- `pgworker sql grants --producer ROLE --worker ROLE --viewer ROLE [--schema S] [--apply]`.
-- {schema}, {producer}, {worker} and {viewer} are quoted identifiers. The schema's owner (the
-- role that runs `pgworker migrate`) keeps everything else: DDL, DELETE (a worker prunes
-- through two functions of the owner's, below), operator actions (cancel, replay write
-- job_events). Privileges follow the PostgreSQL
-- docs, 5.8 "Privileges": column-level INSERT/SELECT/UPDATE; SELECT ... FOR UPDATE needs
-- UPDATE on at least one column; UPDATE ... WHERE needs SELECT on the columns it reads.
-- A "producer" owns the jobs of the schema it may write to: one schema per tenant
-- isolates tenants (pgworker does not record which role enqueued a job).

-- name: producer
-- Enqueue: the schema, and INSERT of the columns a producer chooses only. The state,
-- attempts, lease and error columns keep their defaults, so a producer cannot insert a
-- job that looks claimed, leased or dead.
GRANT USAGE ON SCHEMA {schema} TO {producer};
GRANT INSERT (id, queue, task, payload, priority, run_at, max_attempts, dedupe_key, dedupe_window,
              ordering_key, dead_blocks_key, blocked, trace_context, waiting_parents, has_children,
              cancel_on_parent_failure, graph_id) ON {schema}.jobs TO {producer};
-- ids for bulk enqueue (COPY), and the identity default of single inserts
GRANT USAGE ON SEQUENCE {schema}.jobs_id_seq TO {producer};
-- The state of jobs, never their payloads, error messages, lease owners or trace
-- contexts; the enqueue statements read these columns too (RETURNING, dedupe and
-- ordering-key checks), and the client checks the schema version.
GRANT SELECT (id, queue, task, state, priority, run_at, attempts, max_attempts, lease_token,
              lease_expires_at, last_error_code, dedupe_key, dedupe_until, ordering_key,
              dead_blocks_key, blocked, created_at, finished_at, schedule_name, schedule_slot,
              waiting_parents, has_children, cancel_on_parent_failure, graph_id)
    ON {schema}.jobs TO {producer};
-- The read-only views of the queues an application shows its users (`pgworker status`,
-- `queue list`, `queue events`, `schedules`): queue settings and pauses, their audit
-- trail, the schedules. Nothing in them is a payload or an error message.
GRANT SELECT ON {schema}.queues, {schema}.queue_events, {schema}.schedules TO {producer};
-- `pgworker status` names the queues with due jobs that no live pod claims: of the pod
-- registry, only which queues each pod claims and whether it is alive.
GRANT SELECT (queues, stopped_at, last_seen) ON {schema}.pods TO {producer};
-- A duplicate enqueue releases a dedupe hold whose window (after success) has passed.
GRANT UPDATE (dedupe_until) ON {schema}.jobs TO {producer};
-- Dependencies (docs/graphs.md): an enqueue with depends_on locks its parents and marks
-- them (has_children), and writes the edges; `jobs show` reads them. The rule that
-- unblocks children runs in the triggers, as the schema's owner: no grant for it.
GRANT UPDATE (has_children) ON {schema}.jobs TO {producer};
GRANT SELECT, INSERT ON {schema}.job_dependencies TO {producer};
GRANT SELECT ON {schema}.migrations TO {producer};
-- Every enqueue statement calls claim_stamp (and claim_backdate for a run_at in the past),
-- the claim-floor protocol of migration 0013: EXECUTE stays granted to PUBLIC on both (a
-- lock and an epoch bump, which can cost a claimer a walk from the start, nothing more),
-- and claim_backdate runs as the schema's owner: no grant here.
-- What its jobs returned (App.result, App.wait_result): the producer asked for the work
GRANT SELECT ON {schema}.job_results TO {producer};

-- name: worker
-- Claim, renew, record outcomes, run the reaper and the pruner, read queue statistics:
-- SELECT on jobs and UPDATE of the lifecycle columns only (never the payload, queue,
-- task, priority, attempt budget or keys). No DELETE, TRUNCATE, DDL or job_events.
GRANT USAGE ON SCHEMA {schema} TO {worker};
GRANT SELECT ON {schema}.jobs TO {worker};
GRANT UPDATE (state, run_at, attempts, lease_owner, lease_token, lease_expires_at, started_at,
              heartbeat_at, finished_at, last_error_code, errors, blocked, cancel_requested_at,
              dedupe_until, progress, progress_message, progress_at)
    ON {schema}.jobs TO {worker};
-- handlers enqueue follow-up jobs (the producer's INSERT); the scheduler enqueues
-- periodic jobs with their slot
GRANT INSERT (id, queue, task, payload, priority, run_at, max_attempts, dedupe_key, dedupe_window,
              ordering_key, dead_blocks_key, blocked, trace_context, schedule_name, schedule_slot,
              waiting_parents, has_children, cancel_on_parent_failure, graph_id)
    ON {schema}.jobs TO {worker};
-- handlers enqueue dependent jobs too, and read their parents' results (ctx.parent_results)
GRANT UPDATE (has_children) ON {schema}.jobs TO {worker};
GRANT SELECT, INSERT ON {schema}.job_dependencies TO {worker};
-- the claim reads each queue's policy and, for a rate-limited queue, spends its tokens
GRANT SELECT, UPDATE (tokens, tokens_at) ON {schema}.queues TO {worker};
-- the scheduler registers schedules and advances each one's last slot (compare-and-set)
GRANT SELECT, INSERT, UPDATE ON {schema}.schedules TO {worker};
GRANT USAGE ON SEQUENCE {schema}.jobs_id_seq TO {worker};
GRANT SELECT ON {schema}.migrations TO {worker};
GRANT EXECUTE ON FUNCTION {schema}.bounded_append(jsonb, jsonb, integer) TO {worker};
-- the pruner (on by default): retention through two SECURITY DEFINER functions owned by
-- the schema's owner (migration 0005), which delete only finished jobs and queue audit
-- events past the retention given; the queues' audit trail is read to choose its events
-- (nothing in it is a payload or an error message, and the producer may read it too)
GRANT EXECUTE ON FUNCTION {schema}.delete_finished_jobs(bigint[], double precision, double precision,
                                                        double precision) TO {worker};
GRANT EXECUTE ON FUNCTION {schema}.delete_queue_events(bigint[], double precision) TO {worker};
GRANT SELECT ON {schema}.queue_events TO {worker};
-- the pod registry the console's Workers page reads: each pod refreshes its own row,
-- marks it stopped, and prunes rows left by pods that were killed
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.pods TO {worker};
-- durable steps and external effects (ctx.step, ctx.effect): fenced inserts and updates
GRANT SELECT, INSERT, UPDATE ON {schema}.job_steps TO {worker};
-- results: stored by the fenced success (job_complete, ON CONFLICT updates a replayed
-- job's), read back for a dependent's context and for App.result
GRANT SELECT, INSERT, UPDATE (result, stored_at) ON {schema}.job_results TO {worker};

-- name: viewer
-- The web console in read-only mode (`pgworker web --read-only`): it reads every page's
-- tables, payloads and errors included (the console redacts the fields it is told to),
-- and writes nothing: no INSERT, UPDATE or DELETE anywhere, so a console left open by
-- mistake, or a bug in it, cannot change a job. LISTEN needs no grant.
GRANT USAGE ON SCHEMA {schema} TO {viewer};
GRANT SELECT ON {schema}.jobs, {schema}.job_events, {schema}.queues, {schema}.queue_events,
                {schema}.schedules, {schema}.migrations, {schema}.pods, {schema}.bulk_operations,
                {schema}.bulk_operation_jobs, {schema}.job_steps, {schema}.job_results,
                {schema}.job_dependencies TO {viewer};
GRANT EXECUTE ON FUNCTION {schema}.console_job_filter(jsonb, text, text, text, text, text, text, timestamptz, jsonb,
                                                       bigint) TO {viewer};
