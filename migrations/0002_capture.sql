-- Capture, part 1 (ADR-0062, ADR-0066). Every key and index leads with (cluster, subscription)
-- so a distributed Postgres can shard by them unchanged.

-- The install record of every tap incarnation: one row from the moment a node's capture queue
-- was (re-)created until the tap was removed or found gone. What a drained copy's original
-- address comes from (ADR-0062 D4), and where a node's coverage starts (a broker restart or a
-- failover ends one row and a later pass starts the next: the interval between is a gap).
CREATE TABLE capture_tap (
    id               BIGSERIAL,
    -- namespace/name of the ArtemisCluster
    cluster          TEXT NOT NULL,
    -- the ArtemisCaptureSubscription's name (its namespace is the cluster's)
    subscription     TEXT NOT NULL,
    subscription_uid TEXT,
    instance_id      TEXT NOT NULL,
    -- logical node: the broker node ID (a primary and its backup share it)
    node             TEXT NOT NULL,
    -- the endpoint that was active when the tap was installed
    endpoint         TEXT,
    source_address   TEXT NOT NULL,
    capture_queue    TEXT NOT NULL,
    divert           TEXT NOT NULL,
    filter           TEXT,
    installed_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    install_audit_id BIGINT,
    removed_at       TIMESTAMPTZ,
    -- why the row ended: removed by the sweep (and why), or found gone on the broker
    removal_reason   TEXT,
    remove_audit_id  BIGINT,
    PRIMARY KEY (cluster, subscription, id)
);

-- At most one open incarnation per tap and node.
CREATE UNIQUE INDEX capture_tap_open
    ON capture_tap (cluster, subscription, source_address, node, instance_id)
    WHERE removed_at IS NULL;
CREATE INDEX capture_tap_queue ON capture_tap (cluster, subscription, capture_queue, installed_at);

-- One row per capture pass: who held the cluster's advisory lock, when, and what it wrote. A DBA
-- (or a test) sees that passes of one cluster never overlap and which replica serves it.
CREATE TABLE capture_pass (
    id          BIGSERIAL,
    cluster     TEXT NOT NULL,
    instance_id TEXT NOT NULL,
    -- the process that held the lock
    holder      TEXT NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ NOT NULL,
    -- broker commands this pass issued (audit rows), and how it ended
    commands    INT NOT NULL,
    result      TEXT NOT NULL,
    PRIMARY KEY (cluster, id)
);
CREATE INDEX capture_pass_recent ON capture_pass (cluster, started_at DESC);
