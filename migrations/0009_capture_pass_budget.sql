-- Capture (issue 42): a pass has a time budget. Its row says what the budget was and how many
-- taps' installs or removals it left for the next pass because the budget's time for writes was
-- spent (those taps say so in status: PENDING, "deferred").
ALTER TABLE capture_pass
    ADD COLUMN budget_ms INT,
    ADD COLUMN deferred INT NOT NULL DEFAULT 0;
