-- mwmq schema version 19.
--
-- Schema version 19: a RESP SEND with a PRIORITY no longer waits for an
-- application's open transaction (src/policies.rs says how).
--
-- The first message of another priority than 0 in a queue marks the queue
-- `prioritized` (schema 17: the statement that stores it updates the
-- queue's row), in that message's transaction. An application's
-- transaction that sent a queue's first message with a priority
-- (`mwmq.send(..., priority => n)`) holds that row until it ends, and every
-- RESP SEND with a priority to that queue waited for it, each for up to the statement
-- timeout, holding one of mwmq's connections (and, on the async engine,
-- the statements pipelined behind it): six such SENDs held the requests
-- of every queue for ten seconds. Schema 14 had kept RESP from ever waiting
-- for an application's transaction. Now mwmq marks the queue first, in a
-- statement of its own (`mwmq_prioritize`), which waits at most 100 ms for
-- the row (another SEND marking it, a QALTER) and otherwise says so: the
-- SEND is refused with -TRYAGAIN. Once the mark is committed, the SEND's
-- own update of the mark finds nothing to update and takes no lock.
--
-- Schema version 19 (runs with `search_path = mwmq`).

-- Marks queue `qname` prioritized: true, or NULL if it was already (or
-- does not exist); fails with lock_not_available (55P03) when another
-- transaction held its row for 100 ms. (The wait is set in the body, not
-- by a SET clause: every function of mwmq's that has one sets the path
-- alone, `tests/transactional/sqlguard.rs`.) Its commit does not wait for
-- the disk: marks made at once by several SENDs wait for each other's
-- update only, not for a flush. A mark lost in a crash is lost with no
-- message: a SEND's own commit, which waits, flushes the mark before it.
CREATE FUNCTION mwmq_prioritize(qname text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    was text := current_setting('lock_timeout');
    done boolean;
BEGIN
    PERFORM set_config('lock_timeout', '100ms', true);
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE mwmq_queues SET prioritized = true
    WHERE name = qname AND dropped_at IS NULL AND NOT prioritized
    RETURNING true INTO done;
    PERFORM set_config('lock_timeout', was, true);
    RETURN done;
END $$;
REVOKE ALL ON FUNCTION mwmq_prioritize(text) FROM PUBLIC;
