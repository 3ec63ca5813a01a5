//! Steering a queue's deliveries: ordered groups (`SEND q body GROUP g`:
//! a message is handed out only while no older message of its group is
//! left in the queue, so a group's messages go one at a time, in the order
//! sent, and a NACKed or expired one stays first), pausing it (`QPAUSE`/`QRESUME`: SENDs are
//! stored, nothing is handed out, parked RECVs stay parked) and limiting
//! them (`QALTER q CONCURRENCY n`: at most n of its messages leased at once;
//! `QALTER q RATE n/s`: at most n deliveries a second, in bursts of up to a
//! second's worth), across every mwmq process on the database.
//!
//! A queue with none of these (and no delivery limit) is served by RECV's
//! one-statement plain path, as before. Any other queue goes through the SQL
//! function `mwmq_recv`, which hands out nothing for a paused queue and, for
//! a limited one, first takes the queue's advisory lock for the rest of the
//! transaction: each RECV of a limited queue then counts the leases the one
//! before it committed (a statement of PL/pgSQL takes its snapshot after
//! the lock is granted, which a single statement could not), takes tokens
//! from the queue's bucket in `mwmq_queue_limits`, and counts how often a
//! limit cut a RECV short. The dead-letter handling is the same as before
//! (it moved here from the statement RECV prepared). Its last row counts the
//! dead letters and carries the queue's id (NULL: no such queue), so an
//! empty RECV needs no statement of its own to tell the two apart.
//!
//! The lock is held until the commit, so limited RECVs of one queue would
//! run at the disk's flush rate (measured: 0.27x a plain queue's RECV+ACK
//! pairs). Their transactions therefore commit without waiting for the
//! flush (`synchronous_commit = off`, for that transaction only): a crash
//! may forget the last leases, and their messages are then delivered again,
//! as after an expired lease — the at-least-once delivery every RECV has.
//! SENDs and ACKs still wait for their commit to be durable.
//!
//! RATE counts POPs too (schema 10): a POP of a queue with a rate takes the
//! same advisory lock and tokens from the same bucket (`mwmq_pop_allowance`,
//! called only for such queues, in POP's own statement), as many as there
//! are messages visible up to what it asks, so POP and RECV together stay
//! within the rate. Unlike RECV's, a POP's commit still waits for its flush
//! (a POP is at most once: a forgotten POP would deliver its message
//! again), so a rate-limited queue's POPs run at most at the disk's flush
//! rate. CONCURRENCY counts leases, which a POP does not hold.

/// Parses RATE's value: `n/s`, `n/min` or `n/h` (n a positive number; `n`
/// alone is per second), as deliveries per second; 0 lifts the limit.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let bad =
        || format!("RATE {text:?}: a number of deliveries per second, minute or hour (10/s, 30/min, 0: no limit)");
    let (n, per) = match text.split_once('/') {
        Some((n, unit)) => (
            n,
            match unit.to_ascii_lowercase().as_str() {
                "s" | "sec" => 1.0,
                "m" | "min" => 60.0,
                "h" | "hour" => 3600.0,
                _ => return Err(bad()),
            },
        ),
        None => (text, 1.0),
    };
    let n: f64 = n.trim().parse().map_err(|_| bad())?;
    if !n.is_finite() || !(0.0..=1e9).contains(&n) {
        return Err(bad());
    }
    Ok(n / per)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_per_second_minute_or_hour() {
        assert_eq!(parse_rate("10/s").unwrap(), 10.0);
        assert_eq!(parse_rate("30/min").unwrap(), 0.5);
        assert_eq!(parse_rate("7200/h").unwrap(), 2.0);
        assert_eq!(parse_rate("5").unwrap(), 5.0);
        assert_eq!(parse_rate("0").unwrap(), 0.0);
        for bad in ["-1/s", "x/s", "10/fortnight", "NaN", "inf"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }
}
