-- mwmq schema version 1.
--
-- queues, messages, deduplication keys.

CREATE TABLE mwmq_queues (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        dropped_at timestamptz
    );
    CREATE UNIQUE INDEX mwmq_queues_name ON mwmq_queues (name) WHERE dropped_at IS NULL;
    CREATE SEQUENCE mwmq_message_ids;
    CREATE SEQUENCE mwmq_leases;
    CREATE TABLE mwmq_messages (
        queue_id bigint NOT NULL,
        id bigint NOT NULL DEFAULT nextval('mwmq_message_ids'),
        sender text NOT NULL,
        receiver text,
        body bytea NOT NULL,
        sent_at timestamptz NOT NULL DEFAULT now(),
        visible_at timestamptz NOT NULL,
        lease bigint,
        deliveries integer NOT NULL DEFAULT 0,
        PRIMARY KEY (queue_id, id)
    ) WITH (
        fillfactor = 90,
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_insert_scale_factor = 0.05,
        autovacuum_vacuum_cost_delay = 0
    );
    CREATE TABLE mwmq_keys (
        queue_id bigint NOT NULL,
        key text NOT NULL,
        message_id bigint NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (queue_id, key)
    );
    CREATE INDEX mwmq_keys_age ON mwmq_keys (created_at);
