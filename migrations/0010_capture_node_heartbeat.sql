-- Capture (issue 42): an idle drain's coverage is confirmed per node, not per tap. Every process
-- keeps one heartbeat row per (cluster, node) it drains; while a drain is draining, its open
-- coverage row is attached to that row and confirmed with it (one row written per node every
-- few seconds, whatever the taps there). A drain that stops draining is detached, its
-- coverage confirmed until the heartbeat's last beat — written only when that changes.
CREATE TABLE capture_drain_heartbeat (
    id              BIGSERIAL PRIMARY KEY,
    cluster         TEXT NOT NULL,
    node            TEXT NOT NULL,
    -- the process (instance ID and process ID)
    holder          TEXT NOT NULL,
    started_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    confirmed_until TIMESTAMPTZ NOT NULL DEFAULT now()
);

ALTER TABLE capture_coverage ADD COLUMN heartbeat_id BIGINT;

-- What a reader means by a coverage interval: confirmed until its own last confirmation (a
-- batch committed, a detach) or its heartbeat's, whichever is later (greatest ignores NULL).
CREATE VIEW capture_coverage_confirmed AS
SELECT c.id, c.cluster, c.subscription, c.node, c.source_address, c.capture_queue, c.started_at,
       greatest(c.confirmed_until, h.confirmed_until) AS confirmed_until,
       c.ended_at, c.messages
FROM capture_coverage c
LEFT JOIN capture_drain_heartbeat h ON h.id = c.heartbeat_id;
