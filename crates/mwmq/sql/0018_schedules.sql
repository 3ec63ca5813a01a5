-- mwmq schema version 18.
--
-- Schema version 18: periodic jobs (`QSCHEDULE name q "cron" body [TZ zone]
-- [KEY prefix] [CATCHUP none|one|all] [PRIORITY n] [GROUP g] [DELAY ms]`,
-- `QUNSCHEDULE name`, `QSCHEDULES`).
-- The Rust side, and why it is built so: crates/mwmq/src/schedule.rs (the
-- time), src/ticker.rs (the sending), src/commands/schedules.rs (the
-- commands); the statements are in sql/schedules.sql.
--
-- - `mwmq_schedules`: a row per schedule, on its queue's database. `next_at`
--   is its next tick; a ticker (a thread per database in every mwmq
--   process) takes the rows due with `FOR UPDATE SKIP LOCKED`, sends each
--   tick's message and moves `next_at` past them in one transaction, so a
--   tick is sent once whichever process takes it, and a process killed
--   between the tick and the send sends nothing (its transaction is rolled
--   back and the next ticker sends the tick). `last_tick`, `last_run_at`,
--   `last_id`: the latest tick sent, when, and its message; `sent`,
--   `missed`, `refused`, `skipped` count ticks sent, missed (CATCHUP),
--   refused (the queue full) and skipped (its owner may no longer send
--   them: `suspended` says why, NULL while it may). `priority`, `grp`,
--   `delay_ms`: each message's PRIORITY, GROUP and DELAY, as SEND's.
-- - `mwmq_schedule_put`: QSCHEDULE's creation or replacement, under a lock
--   per user so that `max_schedules` holds against concurrent creations, as
--   `mwmq_owned` does for `max_queues`.

CREATE TABLE mwmq_schedules (
    name        text PRIMARY KEY,
    queue_id    bigint NOT NULL REFERENCES mwmq_queues (id) ON DELETE CASCADE,
    cron        text NOT NULL,
    tz          text NOT NULL,
    body        bytea NOT NULL,
    key_prefix  text NOT NULL,
    catchup     text NOT NULL CHECK (catchup IN ('none', 'one', 'all')),
    sender      text NOT NULL,
    created_by  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    next_at     timestamptz NOT NULL,
    last_tick   timestamptz,
    last_run_at timestamptz,
    last_id     bigint,
    sent        bigint NOT NULL DEFAULT 0,
    missed      bigint NOT NULL DEFAULT 0,
    refused     bigint NOT NULL DEFAULT 0,
    priority    smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9),
    grp         text,
    delay_ms    bigint NOT NULL DEFAULT 0 CHECK (delay_ms >= 0),
    skipped     bigint NOT NULL DEFAULT 0,
    suspended   text
);
CREATE INDEX mwmq_schedules_due ON mwmq_schedules (next_at);
CREATE INDEX mwmq_schedules_queue ON mwmq_schedules (queue_id);
CREATE INDEX mwmq_schedules_owner ON mwmq_schedules (created_by) WHERE created_by IS NOT NULL;

-- Creates or replaces schedule `sname`: 'created' or 'replaced'. A
-- replacement needs the admin right (`admin_like`: the caller's patterns as
-- LIKE patterns; NULL: no users) on the queue the schedule sent to so far,
-- and is no longer suspended (its next tick decides again); a creation by
-- `who` (NULL: no users) counts against `cap` (NULL: no limit), its
-- schedules on this database and `elsewhere` on the others. Refusals are
-- raised as Redis errors (MWR01).
CREATE FUNCTION mwmq_schedule_put(sname text, qname text, pcron text, ptz text, pbody bytea, pkey text,
                                  pcatchup text, psender text, who text, admin_like text[], cap bigint,
                                  elsewhere bigint, pnext timestamptz, ppriority smallint, pgrp text,
                                  pdelay bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    q bigint;
    old record;
    existed boolean;
    mine bigint;
BEGIN
    SELECT id INTO q FROM mwmq_queues WHERE name = qname AND dropped_at IS NULL;
    IF q IS NULL THEN
        PERFORM mwmq_rerr(format('NOQUEUE no such queue ''%s''', qname));
    END IF;
    IF who IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('mwmq schedules of ' || who, 0));
    END IF;
    -- Ticks are told apart by their keys: two schedules with one KEY prefix
    -- on one queue would take each other's ticks for their own.
    IF EXISTS (SELECT 1 FROM mwmq_schedules s WHERE s.queue_id = q AND s.key_prefix = pkey AND s.name <> sname) THEN
        PERFORM mwmq_rerr(format('ERR another schedule of queue ''%s'' has the KEY prefix ''%s'': give this one a KEY of its own',
                                 qname, pkey));
    END IF;
    SELECT s.created_by, t.name AS queue, t.dropped_at INTO old
    FROM mwmq_schedules s JOIN mwmq_queues t ON t.id = s.queue_id WHERE s.name = sname FOR UPDATE OF s;
    existed := FOUND;
    IF existed AND admin_like IS NOT NULL AND old.dropped_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM unnest(admin_like) p WHERE old.queue LIKE p ESCAPE '\') THEN
        PERFORM mwmq_rerr(format('NOPERM User %s has no permissions to administer the queue schedule ''%s'' sends to',
                                 who, sname));
    END IF;
    IF cap IS NOT NULL AND (NOT existed OR old.created_by IS DISTINCT FROM who) THEN
        SELECT count(*) INTO mine FROM mwmq_schedules s WHERE s.created_by = who;
        IF mine + elsewhere >= cap THEN
            PERFORM mwmq_rerr(format('OVERQUOTA user %s may have at most %s schedules (max_schedules)', who, cap));
        END IF;
    END IF;
    IF existed THEN
        UPDATE mwmq_schedules SET queue_id = q, cron = pcron, tz = ptz, body = pbody, key_prefix = pkey,
               catchup = pcatchup, sender = psender, created_by = who, next_at = pnext,
               priority = ppriority, grp = pgrp, delay_ms = pdelay, suspended = NULL
        WHERE name = sname;
        RETURN 'replaced';
    END IF;
    INSERT INTO mwmq_schedules (name, queue_id, cron, tz, body, key_prefix, catchup, sender, created_by, next_at,
                                priority, grp, delay_ms)
    VALUES (sname, q, pcron, ptz, pbody, pkey, pcatchup, psender, who, pnext, ppriority, pgrp, pdelay)
    ON CONFLICT (name) DO NOTHING;
    IF NOT FOUND THEN
        PERFORM mwmq_rerr(format('TRYAGAIN schedule ''%s'' was created at the same moment by another client', sname));
    END IF;
    RETURN 'created';
END $$;
REVOKE ALL ON FUNCTION mwmq_schedule_put(text, text, text, text, bytea, text, text, text, text, text[], bigint,
                                         bigint, timestamptz, smallint, text, bigint) FROM PUBLIC;
