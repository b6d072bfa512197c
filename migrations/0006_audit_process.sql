-- Which operator process wrote each audit intent, and which processes are alive: a `pending`
-- row whose process stopped heartbeating can never be completed by it, so another process
-- completes it as `unknown` (issue 22 item 5). Rows written before this migration have no
-- process: they are from a binary that is gone once a new one runs.
ALTER TABLE audit_event ADD COLUMN process_id TEXT;

CREATE TABLE operator_process (
    process_id   TEXT PRIMARY KEY,
    instance_id  TEXT NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX audit_event_pending ON audit_event (process_id) WHERE outcome = 'pending';
