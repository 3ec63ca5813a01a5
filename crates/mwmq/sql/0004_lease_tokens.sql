-- mwmq schema version 4.
--
-- a lease is a random 64-bit token, not a sequence, and names whom
-- the message was delivered to (only they, or an admin of the queue, may
-- ACK, NACK or TOUCH it). The token is the two halves of a random UUID
-- XORed: each half has its fixed version or variant bits elsewhere, so
-- all 64 bits come from the server's strong random source.

ALTER TABLE mwmq_messages ADD COLUMN leased_to text;
    CREATE FUNCTION mwmq_lease_token() RETURNS bigint LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
        SELECT ('x' || encode(substring(u FROM 1 FOR 8), 'hex'))::bit(64)::bigint
             # ('x' || encode(substring(u FROM 9 FOR 8), 'hex'))::bit(64)::bigint
        FROM uuid_send(gen_random_uuid()) AS u
    $$;
