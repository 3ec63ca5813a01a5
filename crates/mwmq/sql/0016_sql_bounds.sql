-- mwmq schema version 16.
--
-- The SQL API's last differences from RESP's SEND (schema version 16): the
-- names a message carries are bounded as SEND bounds them, and a quota set
-- or lifted while SQL transactions are open counts their messages right.
--
-- **Names.** `mwmq.send` stored `receiver`, `key` and `message_group`
-- whatever their size: a role allowed 1,000-byte bodies stored 96 MB in
-- one row's receiver, which neither `max_body` nor MAXBYTES counts (only
-- PostgreSQL's 8 KB index row limit stopped a key or a group). SEND's `TO`,
-- `KEY` and `GROUP` are names of 1 to [`crate::command::MAX_NAME`] (200)
-- bytes without whitespace or control characters (`command.rs`); now
-- `mwmq.send` refuses the same values, before anything is looked up or
-- stored: `54000` over 200 bytes, `22023` empty or with a space or a
-- control character (the characters Rust's `char::is_whitespace` and
-- `char::is_control` name, listed in `mwmq_sql_name`'s pattern).
--
-- **A quota that appears during a transaction.** A message is marked
-- `counted` when it is stored if its queue has a quota then, and only
-- counted messages are counted. QALTER/QCREATE set or lift a quota, then
-- mark what the queue holds and recount it (`db/statements.rs`), but they cannot see
-- rows of transactions still open: an SQL transaction that sent 50 messages
-- to a queue without a quota and committed after `QALTER ... MAXMESSAGES
-- 10` left 50 uncounted messages (QINFO said 0 held, and the queue took
-- SENDs up to 54), until the next QALTER that set a quota. Three ways were
-- weighed: counting every message whatever the quota (the counting
-- triggers on every SEND and ACK of every queue, which schema 5 chose not
-- to pay); a lock SQL senders hold to their end and QALTER takes (an
-- application's transaction open for minutes would make QALTER wait that
-- long); and this one, the check at COMMIT: a deferred constraint trigger
-- (`mwmq_messages_settle`, on every row `mwmq.send` stores: the
-- transaction runs with `mwmq.sql_caller = on`, `sqlquota.rs`) reads, when
-- the caller commits, whether the queue has a quota *now*, and marks and
-- counts (or unmarks and uncounts) the row to match, in the SQL stripes.
-- Reading and committing must not straddle the QALTER's recount, so the
-- trigger holds the queue's settle lock (an advisory lock, shared) from
-- its read to the end of the transaction — during COMMIT only — and a
-- QALTER that sets or lifts a quota (a QCREATE's queue is new: nobody sent
-- to it yet), once that change is
-- committed, takes the same lock exclusively and lets it go
-- (`mwmq_settle_barrier`) before it marks and recounts: a transaction that
-- read before the change has committed by then, so the recount sees its
-- rows; one that reads after sees the change. Under REPEATABLE READ or
-- SERIALIZABLE the trigger reads the queue's row with a lock, so a change
-- made after the transaction's snapshot fails the COMMIT with `40001`
-- (retry) rather than be missed.
--
-- The barrier waits at most `lock_timeout`, here half the connection's
-- statement timeout and at most 5 s: a transaction that runs `SET
-- CONSTRAINTS ... IMMEDIATE` after its sends holds the lock from there to
-- its end. The QALTER then marks and recounts all the same and answers
-- `-TRYAGAIN` (the change itself is made): retried once that transaction
-- ended, it recounts again. Changing a quota's value needs no barrier
-- (every row is counted before and after) and takes none.
--
-- What remains: a message stored before the quota was set is let in at
-- COMMIT even if the queue is over its quota by then, as the messages the
-- queue already held when the quota was set stay (QALTER removes none); a
-- RESP SEND whose statement began before the change and commits after the
-- recount's snapshot stays uncounted (at most the SENDs of the statements
-- running at that moment, `batch` each, until the next QALTER that sets a
-- quota) — docs/mwmq.md, "Enqueue in the application's own transaction".
--
-- Schema version 16 (runs with `search_path = mwmq`).

-- Whether value (a name mwmq.send stores) is one SEND would take: NULL
-- (absent), or 1 to 200 bytes without whitespace or control characters.
CREATE FUNCTION mwmq.mwmq_sql_name(value text, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, mwmq, pg_temp AS $$
DECLARE
    size bigint := pg_catalog.octet_length(value);
BEGIN
    IF size OPERATOR(pg_catalog.>) 200 THEN
        RAISE EXCEPTION 'mwmq.send: % must be 1 to 200 bytes without spaces or control characters, not % bytes', what, size
            USING ERRCODE = 'program_limit_exceeded';
    ELSIF size OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'mwmq.send: % must be 1 to 200 bytes without spaces or control characters, not empty', what
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF value OPERATOR(pg_catalog.~) '[\u0001-\u0020\u007f-\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]' THEN
        RAISE EXCEPTION 'mwmq.send: % must be 1 to 200 bytes without spaces or control characters, and has one', what
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;
REVOKE ALL ON FUNCTION mwmq.mwmq_sql_name(text, text) FROM PUBLIC;

-- At COMMIT, for each message mwmq.send stored: marked and counted if its
-- queue has a quota now, unmarked and uncounted if not (sqlbounds.rs).
CREATE FUNCTION mwmq.mwmq_settle_at_commit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, mwmq, pg_temp AS $$
DECLARE
    quota boolean;
    size bigint;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(
        pg_catalog.hashtextextended(pg_catalog.concat('mwmq settle ', NEW.queue_id), CAST(0 AS pg_catalog.int8)));
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        SELECT mq.max_messages IS NOT NULL OR mq.max_bytes IS NOT NULL INTO quota
        FROM mwmq.mwmq_queues AS mq WHERE mq.id OPERATOR(pg_catalog.=) NEW.queue_id;
    ELSE
        -- The transaction's snapshot: a row changed since fails here (40001).
        SELECT mq.max_messages IS NOT NULL OR mq.max_bytes IS NOT NULL INTO quota
        FROM mwmq.mwmq_queues AS mq WHERE mq.id OPERATOR(pg_catalog.=) NEW.queue_id FOR KEY SHARE;
    END IF;
    quota := COALESCE(quota, false);
    UPDATE mwmq.mwmq_messages AS m SET counted = quota
    WHERE m.queue_id OPERATOR(pg_catalog.=) NEW.queue_id AND m.id OPERATOR(pg_catalog.=) NEW.id
      AND m.counted OPERATOR(pg_catalog.<>) quota
    RETURNING pg_catalog.octet_length(m.body) INTO size;
    IF FOUND THEN
        INSERT INTO mwmq.mwmq_queue_counts AS c (queue_id, stripe, messages, bytes)
        VALUES (NEW.queue_id, pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.%) 16 OPERATOR(pg_catalog.+) 16,
                CASE WHEN quota THEN 1 ELSE -1 END,
                CASE WHEN quota THEN size ELSE 0 OPERATOR(pg_catalog.-) size END)
        ON CONFLICT (queue_id, stripe) DO UPDATE
        SET messages = c.messages OPERATOR(pg_catalog.+) EXCLUDED.messages,
            bytes = c.bytes OPERATOR(pg_catalog.+) EXCLUDED.bytes;
    END IF;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION mwmq.mwmq_settle_at_commit() FROM PUBLIC;
CREATE CONSTRAINT TRIGGER mwmq_messages_settle AFTER INSERT ON mwmq.mwmq_messages
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (pg_catalog.current_setting('mwmq.sql_caller', true) OPERATOR(pg_catalog.=) 'on')
    EXECUTE FUNCTION mwmq.mwmq_settle_at_commit();

-- QALTER's wait, after a quota was set or lifted, for the
-- transactions that read the queue's quota at COMMIT before the change:
-- false if one still holds the lock after lock_timeout (half the
-- statement timeout, at most 5 s).
CREATE FUNCTION mwmq_settle_barrier(q_name text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    qid bigint;
    st bigint := (SELECT s.setting::bigint FROM pg_settings s WHERE s.name = 'statement_timeout');
BEGIN
    SELECT q.id INTO qid FROM mwmq_queues q WHERE q.name = q_name AND q.dropped_at IS NULL;
    IF NOT FOUND THEN
        RETURN true;
    END IF;
    PERFORM set_config('lock_timeout', (CASE WHEN st = 0 THEN 5000 ELSE least(5000, greatest(st / 2, 1)) END)::text, true);
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtextextended(concat('mwmq settle ', qid), 0));
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION mwmq_settle_barrier(text) FROM PUBLIC;

-- mwmq.send checks the names before anything else, and keeps the settle
-- trigger for COMMIT whatever SET CONSTRAINTS the caller ran before. Both
-- statements are patched into whatever body the earlier versions left.
DO $patch$
DECLARE
    f regprocedure := 'mwmq.send(text, bytea, text, bigint, text, text)'::regprocedure;
    def text := pg_catalog.pg_get_functiondef(f);
    caller text := $c$    PERFORM pg_catalog.set_config('mwmq.sql_caller', 'on', true);$c$;
    names text := $n$    PERFORM mwmq.mwmq_sql_name(send.receiver, 'receiver');
    PERFORM mwmq.mwmq_sql_name(send.key, 'key');
    PERFORM mwmq.mwmq_sql_name(send.message_group, 'message_group');$n$;
    store text := $s$    INSERT INTO mwmq.mwmq_messages (queue_id, id, sender, receiver, body, visible_at, counted, grp)$s$;
    settle text := $d$    SET CONSTRAINTS mwmq.mwmq_messages_settle DEFERRED;$d$;
BEGIN
    IF pg_catalog.strpos(def, caller) OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'mwmq.send no longer marks its caller as schema version 14 wrote it: check the names before that where it is now';
    END IF;
    IF pg_catalog.strpos(def, store) OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'mwmq.send no longer stores its message as schema version 11 wrote it: keep the settle trigger deferred where it is now';
    END IF;
    def := pg_catalog.replace(def, caller, names OPERATOR(pg_catalog.||) pg_catalog.chr(10) OPERATOR(pg_catalog.||) caller);
    def := pg_catalog.replace(def, store, settle OPERATOR(pg_catalog.||) pg_catalog.chr(10) OPERATOR(pg_catalog.||) store);
    EXECUTE def;
END $patch$;
