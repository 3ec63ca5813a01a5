//! A blocking carrier's round, as a pool worker and the route tree's side
//! thread both carry it: the round written to every server involved, then
//! every reply read, each call's end handed over as it comes; how long to
//! wait and what a failure means is the exchange's (`exchange.rs`).

use mwstats::clock::now_ns;

use crate::backend::Backend;
use crate::exchange::{Ended, Exchange, Servers, Verdict};
use crate::route::{BackendError, Outbox};

/// A call of a round: its request's place among the carrier's requests and
/// the call's index in its round.
pub type Tag = (usize, usize);

/// A carrier's connection to one server and its exchange.
pub struct Link {
    /// The socket.
    pub conn: Backend,
    /// What the server owes.
    pub ex: Exchange<Tag>,
}

/// Writes the round in `outbox` (`owners` naming its calls) to every server
/// involved, then reads every reply; each call's end goes to `ended`.
/// `links` (by server number) grows to the servers the round names; `out`
/// is a scratch buffer.
pub fn exchange(
    servers: &Servers,
    links: &mut Vec<Link>,
    outbox: &Outbox,
    owners: &[Tag],
    out: &mut Vec<u8>,
    ended: &mut impl FnMut(Ended<'_, Tag>),
) {
    while links.len() < outbox.servers() {
        let s = links.len();
        links.push(Link { conn: Backend::new(servers.addr(s)), ex: Exchange::new(s) });
    }
    let connect_timeout = servers.connect_timeout();
    for (s, Link { conn, ex }) in links.iter_mut().enumerate() {
        if outbox.bytes(s).is_empty() {
            continue;
        }
        out.clear();
        let open = || conn.open(connect_timeout, || servers.tls(s));
        if ex.begin(servers, outbox, owners, out, now_ns(), open, ended) {
            if let Err(e) = write_all(conn, ex, servers, out, ended) {
                conn.close();
                ex.fail(servers, &e, now_ns(), ended);
            }
        }
    }
    for Link { conn, ex } in links.iter_mut().filter(|l| l.ex.in_flight()) {
        if let Err(e) = read_replies(conn, ex, servers, ended) {
            conn.close();
            ex.fail(servers, &e, now_ns(), ended);
        } else if ex.in_flight() {
            // Only replies of calls given up are left: drop them with the connection.
            conn.close();
            ex.fail(servers, &BackendError::Stalled, now_ns(), ended);
        }
    }
}

/// Writes `bytes` whole, for as long as the exchange lets the carrier wait.
pub fn write_all(
    conn: &mut Backend,
    ex: &mut Exchange<Tag>,
    servers: &Servers,
    bytes: &[u8],
    ended: &mut impl FnMut(Ended<'_, Tag>),
) -> Result<(), BackendError> {
    let mut written = 0;
    loop {
        let limit = ex.wait_limit(servers, now_ns());
        // The bytes, then what a TLS session still holds of them.
        let progress = if written < bytes.len() {
            conn.write(&bytes[written..], limit)?.map(|n| written += n).is_some()
        } else if conn.push(limit)? {
            return Ok(());
        } else {
            false
        };
        if !progress {
            match ex.check(servers, now_ns(), ended) {
                Verdict::Wait => {}
                Verdict::GaveUp => return Err(BackendError::Stalled),
                Verdict::TimedOut => return Err(BackendError::Timeout),
            }
        }
    }
}

/// Reads until the server owes nothing but replies of calls given up.
pub fn read_replies(
    conn: &mut Backend,
    ex: &mut Exchange<Tag>,
    servers: &Servers,
    ended: &mut impl FnMut(Ended<'_, Tag>),
) -> Result<(), BackendError> {
    while ex.owed() {
        match conn.read(ex.wait_limit(servers, now_ns()))? {
            Some(_) => {
                let now = now_ns();
                ex.progress(servers, now);
                let used = ex.replies(servers, conn.buffered(), now, ended)?;
                conn.consume(used);
            }
            None => match ex.check(servers, now_ns(), ended) {
                Verdict::Wait => {}
                Verdict::GaveUp => return Ok(()),
                Verdict::TimedOut => return Err(BackendError::Timeout),
            },
        }
    }
    Ok(())
}
