-- Capture (issue 42 item 3): a loss estimate says which bound it is. 'exact': counted from the
-- broker's own counters on both sides (e.g. a failover window: the source address's
-- RoutedMessageCount since the node became active − the re-created capture queue's
-- MessagesAdded); 'upper' / 'lower': at most / at least that many were lost. Null: an estimate
-- that claims neither (or counts of differing bounds added together, e.g. an upper and a lower).
ALTER TABLE capture_loss
    ADD COLUMN bound TEXT CHECK (bound IS NULL OR bound IN ('exact', 'upper', 'lower'));
