-- Capture (issue 25): every AMQP body kind stored faithfully, and what had to change for
-- Postgres to take a copy said on the row itself (ADR-0062 D10: a row claims what it can).

-- The copy's body section: 'data' (body_binary), 'amqp-value' (a string in body_text, a binary
-- in body_binary, any other value as its JSON rendering in body_text), 'amqp-sequence' (a JSON
-- array of the sequence sections in body_text) or 'empty'. Null: a sampled row, or one stored
-- before this migration.
ALTER TABLE captured_message
    ADD COLUMN body_kind TEXT
        CHECK (body_kind IS NULL OR body_kind IN ('data', 'amqp-value', 'amqp-sequence', 'empty')),
    -- What was changed so that Postgres could store the copy, one entry per part, e.g.
    -- 'body: text containing U+0000 stored as its UTF-8 bytes in body_binary' or
    -- 'properties.note: U+0000 written as \u0000 and \ as \\'. Null: stored as received.
    ADD COLUMN escaped TEXT[];
