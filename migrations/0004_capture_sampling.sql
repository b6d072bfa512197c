-- Capture, part 3 (ADR-0062 D3, D10): sampling for uncaptured queues. A subscription in mode
-- Sample installs no tap; it browses (never consumes) each matching queue on every live node and
-- stores each message it had not seen before, as a captured_message row with origin 'sampled'.

-- The subscription's mode, kept current by the operator whenever it sees the subscription: the
-- reading commands label a subscription's tail "sampled" from it, permanently (ADR-0060's
-- obligation, kept by ADR-0062).
ALTER TABLE capture_subscription
    ADD COLUMN mode TEXT NOT NULL DEFAULT 'capture' CHECK (mode IN ('capture', 'sample')),
    -- seconds between two browses (mode 'sample'); null in mode 'capture'
    ADD COLUMN sample_interval_seconds INT CHECK (sample_interval_seconds IS NULL OR sample_interval_seconds >= 1),
    -- when the operator last saw the mode (or the interval) change
    ADD COLUMN mode_changed_at TIMESTAMPTZ;

-- Per (subscription, node, browsed queue): the highest broker message ID already stored, so a
-- browse stores only what is newer, and an operator restart never stores a message twice. The
-- high-water mark and the rows it covers are written in one transaction.
CREATE TABLE capture_sample_mark (
    cluster        TEXT NOT NULL,
    subscription   TEXT NOT NULL,
    -- logical node: the broker node ID (a primary and its backup share it, and its IDs)
    node           TEXT NOT NULL,
    queue          TEXT NOT NULL,
    address        TEXT NOT NULL,
    -- highest broker message ID stored from this queue on this node (0: none yet)
    high_water     BIGINT NOT NULL DEFAULT 0,
    -- rows stored from this queue on this node
    sampled        BIGINT NOT NULL DEFAULT 0,
    -- successful browses: evidence that sampling looked, whether or not it found anything
    browses        BIGINT NOT NULL DEFAULT 0,
    last_browse_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, subscription, node, queue)
);
