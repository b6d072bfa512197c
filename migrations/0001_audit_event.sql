-- One row per command (ADR-0049): written as intent before the first broker write, completed
-- with the per-node outcome after. Never holds secrets or message payloads.
CREATE TABLE audit_event (
    id              BIGSERIAL PRIMARY KEY,
    occurred_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at    TIMESTAMPTZ,
    instance_id     TEXT NOT NULL,
    -- the field manager that last changed the object's spec (from managedFields)
    actor           TEXT NOT NULL,
    command         TEXT NOT NULL,
    cluster         TEXT NOT NULL,
    target          TEXT NOT NULL,
    object_kind     TEXT NOT NULL,
    object_namespace TEXT NOT NULL,
    object_name     TEXT NOT NULL,
    object_uid      TEXT NOT NULL,
    object_generation BIGINT,
    params          JSONB NOT NULL DEFAULT '{}'::jsonb,
    -- pending (intent written, outcome not yet known), succeeded, failed, unknown
    outcome         TEXT NOT NULL DEFAULT 'pending'
        CHECK (outcome IN ('pending', 'succeeded', 'failed', 'unknown')),
    outcome_detail  JSONB
);

CREATE INDEX audit_event_object ON audit_event (object_uid, occurred_at DESC);
CREATE INDEX audit_event_cluster ON audit_event (cluster, occurred_at DESC);
