-- mwmq schema version 14.
--
-- The SQL API's locks kept apart from RESP's (schema version 14): an
-- application's transaction, open as long as it likes, never makes a RESP
-- statement wait, and delays at worst other SQL callers of the same queue.
--
-- **Counters of their own.** A queue's quota is counted in
-- `mwmq_queue_counts`, in stripes chosen by the backend's pid so that
-- concurrent statements do not queue on one row. A counter row changed by
-- a transaction stays locked until that transaction ends, so before this
-- version an SQL caller's open transaction (`BEGIN; SELECT mwmq.send(...)`
-- and nothing more) held one of RESP's 16 stripes, and 16 of them, one per
-- `pid % 16`, made every RESP SEND and ACK of the queue wait until its
-- statement timeout while holding one of mwmq's database connections, which
-- soon stalled every other queue too. Now `mwmq.send` and `mwmq.ack` run
-- with `mwmq.sql_caller = on` (set by each before its rights check, for the
-- rest of the caller's transaction, which only ever counts as an SQL caller),
-- and the counting triggers put what they change in stripes 16 + `pid % 16`,
-- which no RESP statement writes: RESP's quota check, QINFO and the count
-- a SEND refused with read the sum of all 32 with a plain read, which never
-- waits for a row lock; the recount of QCREATE/QALTER (`db/statements.rs`) leaves the
-- SQL stripes alone and sets stripe 0 to what the queue holds minus them.
--
-- **The check stays at COMMIT.** `mwmq_messages_quota`, the deferred
-- constraint trigger that takes the queue's row of `mwmq_sql_gates` and
-- counts what is committed plus the transaction's own, only runs in SQL
-- callers' transactions (RESP never writes the gate). A caller's `SET
-- CONSTRAINTS ALL IMMEDIATE` made it run inside `mwmq.send` instead, taking
-- the gate for the rest of the transaction and checking against what was
-- committed then rather than at COMMIT; `mwmq.send` now sets that one
-- constraint back to DEFERRED before every message it stores in a queue
-- with a quota, so it runs at COMMIT whatever the caller set before. A
-- caller that sets it IMMEDIATE *after* its last send makes PostgreSQL run
-- the check then (no trigger can tell that from a COMMIT): the gate is held
-- from there to the end of the transaction (other SQL commits to that queue
-- wait; RESP does not), and RESP SENDs that commit in between are not in its
-- count, so the queue may then pass its quota by that transaction's own
-- messages, which passed the check. docs/mwmq.md ("Enqueue in the
-- application's own transaction") derives the bound with both kinds of
-- senders.
--
-- Schema version 14 (runs with `search_path = mwmq`).

CREATE OR REPLACE FUNCTION mwmq.mwmq_count_in() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mwmq.mwmq_queue_counts AS c (queue_id, stripe, messages, bytes)
    VALUES (NEW.queue_id,
            pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.%) 16 OPERATOR(pg_catalog.+)
                CASE WHEN pg_catalog.current_setting('mwmq.sql_caller', true) OPERATOR(pg_catalog.=) 'on'
                     THEN 16 ELSE 0 END,
            1, pg_catalog.octet_length(NEW.body))
    ON CONFLICT (queue_id, stripe) DO UPDATE
    SET messages = c.messages OPERATOR(pg_catalog.+) 1, bytes = c.bytes OPERATOR(pg_catalog.+) EXCLUDED.bytes;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION mwmq.mwmq_count_out() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mwmq.mwmq_queue_counts AS c (queue_id, stripe, messages, bytes)
    VALUES (OLD.queue_id,
            pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.%) 16 OPERATOR(pg_catalog.+)
                CASE WHEN pg_catalog.current_setting('mwmq.sql_caller', true) OPERATOR(pg_catalog.=) 'on'
                     THEN 16 ELSE 0 END,
            -1, 0 OPERATOR(pg_catalog.-) pg_catalog.octet_length(OLD.body))
    ON CONFLICT (queue_id, stripe) DO UPDATE
    SET messages = c.messages OPERATOR(pg_catalog.-) 1, bytes = c.bytes OPERATOR(pg_catalog.+) EXCLUDED.bytes;
    RETURN NULL;
END $$;

-- mwmq.send and mwmq.ack count in the SQL stripes: each sets
-- mwmq.sql_caller to on for the rest of the caller's transaction before its
-- rights check, whatever the caller set before. (Not a SET clause of the
-- functions: PostgreSQL lets only a superuser attach a custom setting to a
-- function, and mwmq's role need not be one.)
DO $patch$
DECLARE
    f regprocedure;
    call text;
    def text;
BEGIN
    FOR f, call IN VALUES
        ('mwmq.send(text, bytea, text, bigint, text, text)'::regprocedure,
         $c$    SELECT * INTO who FROM mwmq.mwmq_sql_caller(send.queue, 'send');$c$),
        ('mwmq.ack(text, bigint, bigint)'::regprocedure,
         $c$    SELECT * INTO who FROM mwmq.mwmq_sql_caller(ack.queue, 'receive');$c$)
    LOOP
        def := pg_catalog.pg_get_functiondef(f);
        IF pg_catalog.strpos(def, call) OPERATOR(pg_catalog.=) 0 THEN
            RAISE EXCEPTION '% no longer checks its caller''s rights as schema version 11 wrote it', f;
        END IF;
        EXECUTE pg_catalog.replace(def, call,
            $s$    PERFORM pg_catalog.set_config('mwmq.sql_caller', 'on', true);$s$ || pg_catalog.chr(10) || call);
    END LOOP;
END $patch$;

-- mwmq.send keeps the quota's check for COMMIT whatever SET CONSTRAINTS the
-- caller ran before. The one statement is patched into whatever body the
-- earlier versions left (sqlguard.rs wrote it, streambounds.rs changed its
-- refusal), so this version does not undo theirs.
DO $patch$
DECLARE
    f regprocedure := 'mwmq.send(text, bytea, text, bigint, text, text)'::regprocedure;
    was text := $old$        -- The quota is checked again at COMMIT (mwmq_quota_at_commit).
        PERFORM pg_catalog.set_config('mwmq.sql_send', 'on', true);$old$;
    now_ text := $new$        -- The quota is checked again at COMMIT (mwmq_quota_at_commit), and
        -- only there: a SET CONSTRAINTS ... IMMEDIATE of the caller's would
        -- run it here, holding the queue's gate for the rest of the
        -- transaction and counting without what commits meanwhile.
        SET CONSTRAINTS mwmq.mwmq_messages_quota DEFERRED;
        PERFORM pg_catalog.set_config('mwmq.sql_send', 'on', true);$new$;
    def text := pg_get_functiondef(f);
BEGIN
    IF position(was IN def) = 0 THEN
        RAISE EXCEPTION 'mwmq.send no longer marks its rows for the check at COMMIT as schema version 11 wrote it: keep that check deferred where it is now';
    END IF;
    EXECUTE replace(def, was, now_);
END $patch$;
