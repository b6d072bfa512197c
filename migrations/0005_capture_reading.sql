-- Capture, part 3 (ADR-0062 D2): reading what was captured. A stable row identity for a live
-- tail (seen-set across polls) and for paging a search; indexes for request-reply correlation
-- and for reading one address across a cluster's subscriptions.
ALTER TABLE captured_message ADD COLUMN row_id BIGSERIAL;
CREATE INDEX captured_message_address ON captured_message (cluster, original_address, captured_at);
CREATE INDEX captured_message_correlation
    ON captured_message (cluster, correlation_id) WHERE correlation_id IS NOT NULL;
