-- Capture, part 2 (ADR-0062 D4, D9, D10; ADR-0066 D2): what the drain stores, what it covered
-- and what was lost. Every key and index leads with (cluster, subscription), so a distributed
-- Postgres (e.g. Citus, distributing on them) can take the schema unchanged.

-- A stable number per (cluster, subscription): the partition key of captured_message.
CREATE TABLE capture_subscription (
    id           BIGSERIAL PRIMARY KEY,
    cluster      TEXT NOT NULL,
    subscription TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (cluster, subscription)
);

-- Captured (and, in part 3, sampled) messages. Partitioned by subscription (LIST), then by
-- capture day (RANGE): retention drops whole day partitions of one subscription, by age and by
-- size, and never deletes rows. A row claims "routed to original_address", nothing more (D10).
CREATE TABLE captured_message (
    cluster           TEXT NOT NULL,
    subscription      TEXT NOT NULL,
    subscription_id   BIGINT NOT NULL,
    -- logical node (broker node ID) whose capture queue it was drained from
    node              TEXT NOT NULL,
    -- from the install record: the capture queue we drained names it (D4), never a header
    original_address  TEXT NOT NULL,
    capture_queue     TEXT NOT NULL,
    -- the original message's broker ID (x-opt-ORIG-MESSAGE-ID / _AMQ_ORIG_MESSAGE_ID); null
    -- when absent (D4). With node and capture queue, the key a redelivered copy is deduped on.
    source_message_id TEXT,
    message_id        TEXT,
    correlation_id    TEXT,
    reply_to          TEXT,
    properties        JSONB NOT NULL DEFAULT '{}'::jsonb,
    headers           JSONB NOT NULL DEFAULT '{}'::jsonb,
    -- text bodies here, binary bodies in body_binary; truncated at the subscription's limit
    body_text         TEXT,
    body_binary       BYTEA,
    body_size         INT NOT NULL,
    body_truncated    BOOLEAN NOT NULL DEFAULT false,
    routed_at         TIMESTAMPTZ,
    captured_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- 'captured' (complete within a covered window) or 'sampled' (a browse saw it, part 3)
    origin            TEXT NOT NULL DEFAULT 'captured' CHECK (origin IN ('captured', 'sampled'))
) PARTITION BY LIST (subscription_id);

CREATE INDEX captured_message_time ON captured_message (cluster, subscription, captured_at);
CREATE INDEX captured_message_source
    ON captured_message (cluster, subscription, node, capture_queue, source_message_id);
CREATE INDEX captured_message_properties ON captured_message USING GIN (properties);
CREATE INDEX captured_message_text
    ON captured_message USING GIN (to_tsvector('simple', coalesce(body_text, '')));

-- Per node, the intervals during which its tap was being drained: one row per drain session.
-- A gap between rows (or before the first) is a gap in coverage (ADR-0062 D6).
CREATE TABLE capture_coverage (
    id              BIGSERIAL,
    cluster         TEXT NOT NULL,
    subscription    TEXT NOT NULL,
    node            TEXT NOT NULL,
    source_address  TEXT NOT NULL,
    capture_queue   TEXT NOT NULL,
    started_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- the drain was confirmed alive (a batch committed, or an idle heartbeat) until here
    confirmed_until TIMESTAMPTZ NOT NULL DEFAULT now(),
    ended_at        TIMESTAMPTZ,
    messages        BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (cluster, subscription, id)
);
CREATE INDEX capture_coverage_node ON capture_coverage (cluster, subscription, node, started_at);

-- Estimated loss per subscription, node and cause, cumulative: ring_overwrite, address_full,
-- rate_cap, broker_restart (what a capture queue held when its counters reset), failover_window
-- (copies routed while a node had the divert but no capture queue: a source-side upper bound).
-- Never silently zero: a cause with no loss is simply absent.
CREATE TABLE capture_loss (
    cluster        TEXT NOT NULL,
    subscription   TEXT NOT NULL,
    node           TEXT NOT NULL,
    source_address TEXT NOT NULL,
    cause          TEXT NOT NULL,
    messages       BIGINT NOT NULL DEFAULT 0,
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, subscription, node, source_address, cause)
);

-- The last broker counters read for each capture queue (they live in broker memory and reset
-- with it): the baseline the next read's loss is computed from, kept across operator restarts.
CREATE TABLE capture_counter (
    cluster        TEXT NOT NULL,
    subscription   TEXT NOT NULL,
    node           TEXT NOT NULL,
    capture_queue  TEXT NOT NULL,
    ring_evicted   BIGINT NOT NULL,
    address_dropped BIGINT NOT NULL,
    messages_added BIGINT NOT NULL,
    message_count  BIGINT NOT NULL,
    read_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, subscription, node, capture_queue)
);
