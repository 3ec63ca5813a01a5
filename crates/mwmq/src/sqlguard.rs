//! The SQL API under mwmq's rules (schema version 11): `mwmq.send` and
//! `mwmq.ack` obey the same users, rights and bounds as SEND and ACK over
//! RESP, and nothing a caller (or anyone who can create objects in
//! `public`) defines runs inside them.
//!
//! **Nothing substituted.** The functions run as their owner (SECURITY
//! DEFINER) with `search_path = pg_catalog, mwmq, pg_temp`: the catalogue
//! first, then the schema only mwmq's user may create in (`db/migrations.rs`), the
//! caller's temporary schema last (PostgreSQL never looks there for a
//! function or an operator). On top of that every table, function, operator
//! and type in their bodies — and in the helpers and triggers they set off —
//! is written with its schema (`mwmq.mwmq_messages`, `pg_catalog.nextval`,
//! `OPERATOR(pg_catalog.*)`, `CAST(x AS pg_catalog.float8)`), so none of
//! them depends on the path at all; note that `OPERATOR(...)` binds like
//! any other operator, hence the parentheses.
//!
//! **Who may do what.** A database role acts as the mwmq user whose
//! `database_roles` list it: at start mwmq writes, in one transaction per
//! database, each role's user, the user's send, receive and admin patterns
//! (as LIKE patterns, `*` becoming `%` and `%`, `_`, `\` escaped) and
//! `max_body` into `mwmq_sql_roles`, and into `mwmq_sql_policy` whether
//! there are users at all and the server's `max_body` ([`publish`]). With
//! users, `mwmq.send` needs the send right on the queue and records the
//! user's name as the sender; `mwmq.ack` needs the receive right and, as ACK
//! does, acts only on a delivery leased to that user unless the user
//! administers the queue; a role no user lists is refused (SQLSTATE 42501).
//! Without users (open, as RESP is then) any role granted the functions may
//! send to and acknowledge on every queue, as itself. The role checked is
//! `session_user`, the role that logged in: inside a SECURITY DEFINER
//! function `current_user` is the owner, and a `SET ROLE` does not change
//! who logged in.
//!
//! **Bounds.** A body longer than the user's `max_body` (else the server's)
//! is refused (`54000`). A queue's MAXMESSAGES and MAXBYTES are checked at
//! the send, against what is committed plus what the caller's own
//! transaction sent, and again at COMMIT: a deferred constraint trigger
//! (fired only for rows `mwmq.send` stored in a queue with a quota: it sets
//! `mwmq.sql_send` for its INSERT, which the trigger's WHEN reads) upserts
//! the queue's row of `mwmq_sql_gates` — the row lock makes committing
//! senders of a queue take turns, and under REPEATABLE READ or SERIALIZABLE
//! a turn taken by a transaction the caller's snapshot does not see fails
//! with 40001 — then counts what is committed plus its own. Over the quota,
//! the COMMIT fails and the transaction is rolled back. Transactions that
//! send in SQL therefore never pass a quota together; SENDs over RESP are
//! not in that queue (their check is in their own statement, as before), so
//! the overshoot is at most the RESP SENDs running at that moment. (Schema
//! 15 gives the refusal at the send the queue's figures: `streambounds.rs`.)

/// A user's queue pattern as a LIKE pattern (escape `\`): `*` matches any
/// run of characters, everything else itself.
pub fn like_pattern(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 4);
    for ch in pattern.chars() {
        match ch {
            '*' => out.push('%'),
            '%' | '_' | '\\' => {
                out.push('\\');
                out.push(ch);
            }
            _ => out.push(ch),
        }
    }
    out
}

/// Writes the users' rights for the SQL API into the database of `cfg`
/// (`mwmq_sql_policy`, `mwmq_sql_roles`), replacing what was there, in one
/// transaction. Roles listed that do not exist in the database are named in
/// a warning.
pub fn publish(cfg: &crate::config::Config) -> Result<(), String> {
    let mut c = crate::db::connect(cfg)?;
    let mut tx = c.transaction().map_err(|e| e.to_string())?;
    let open = cfg.users.is_empty();
    let max_body = cfg.server.max_body as i64;
    // The policy row first: its lock makes two mwmq processes publishing at once take turns.
    tx.execute("UPDATE mwmq_sql_policy SET open = $1, max_body = $2", &[&open, &max_body])
        .map_err(|e| e.to_string())?;
    tx.execute("DELETE FROM mwmq_sql_roles", &[]).map_err(|e| e.to_string())?;
    let likes = |p: &[String]| p.iter().map(|p| like_pattern(p)).collect::<Vec<_>>();
    let mut roles = Vec::new();
    for u in &cfg.users {
        let body = u.max_body.map(|b| b as i64);
        for role in &u.database_roles {
            tx.execute(
                "INSERT INTO mwmq_sql_roles (role, user_name, send_like, receive_like, admin_like, max_body)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[role, &u.name, &likes(&u.send), &likes(&u.receive), &likes(&u.admin), &body],
            )
            .map_err(|e| e.to_string())?;
            roles.push(role.clone());
        }
    }
    let missing = tx
        .query(
            "SELECT r FROM unnest($1::text[]) AS r WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r)",
            &[&roles],
        )
        .map_err(|e| e.to_string())?;
    tx.commit().map_err(|e| e.to_string())?;
    for r in missing {
        let role: String = r.get(0);
        tracing::warn!(role = %role, "a user's database_roles names a role this database does not have");
    }
    if open {
        tracing::info!(
            "no [[users]]: any database role granted mwmq.send and mwmq.ack may send to and acknowledge on every queue"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::like_pattern;

    #[test]
    fn patterns_become_like_patterns_with_like_s_own_characters_escaped() {
        assert_eq!(like_pattern("orders.*"), "orders.%");
        assert_eq!(like_pattern("*"), "%");
        assert_eq!(like_pattern("a_b*"), "a\\_b%");
        assert_eq!(like_pattern("100%"), "100\\%");
        assert_eq!(like_pattern("back\\slash"), "back\\\\slash");
        assert_eq!(like_pattern("a*b*c"), "a%b%c");
    }
}
