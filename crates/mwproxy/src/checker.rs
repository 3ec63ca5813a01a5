//! The active health check (`[backend] check_ms`): a thread that asks the
//! servers `version`, so that their health (`health.rs`), `/readyz` and
//! `/metrics` stay true when no client traffic reaches them — a proxy started
//! while its servers are down says so from its first check, and a server that
//! came back is up again without a client having to try it first.
//!
//! Which server to check and what the outcome means is the health module's
//! business ([`Health::check_due`](crate::health::Health::check_due),
//! [`Health::checked`](crate::health::Health::checked)); this file only moves
//! the bytes, with the same blocking connection a pool worker uses
//! ([`Backend`]): connect within `connect_timeout_ms`, TLS when `[backend]
//! tls` says so, the login first when `[backend] auth_file` names one, then
//! `version\r\n`, and `VERSION ...` must come back within `timeout_ms`.
//! Nothing else is ever sent.
//!
//! The checker has its own connection to each server (never a carrier's),
//! kept between checks like a worker's (checked for a close while idle, and
//! opened anew then, logging in again), closed when a check fails, when the
//! server leaves the configuration, and while checks are off. It looks for due
//! checks every [`SLICE`] (or `check_ms` if shorter); the checks due together
//! run at once, one short thread per server, and the next look waits for all
//! of them, so there is never more than one check of a server in flight and
//! one server that does not answer delays the others' next checks by at most
//! `connect_timeout_ms + timeout_ms`. Client requests never wait for a check.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcproto::Response;

use crate::backend::Backend;
use crate::exchange::Servers;
use crate::route::BackendError;
use crate::shared::Shared;

/// How often the checker looks for due checks at most.
pub const SLICE: Duration = Duration::from_millis(50);

/// Longest reply to `version` (or to the login) taken before it is refused.
const MAX_REPLY: usize = 4096;

/// Runs the checks until the proxy stops.
pub fn run(shared: Arc<Shared>) {
    let servers = &shared.servers;
    let mut generation = shared.generation();
    let mut conns: Vec<Backend> = Vec::new();
    let mut due: Vec<(usize, bool)> = Vec::new();
    while !shared.stopping.load(Ordering::Relaxed) {
        shared.refresh(&mut generation);
        let check_ms = generation.config.backend.check_ms;
        for (s, conn) in conns.iter_mut().enumerate() {
            if check_ms == 0 || !generation.uses(s) {
                conn.close();
            }
        }
        due.clear();
        due.extend(generation.ids.iter().filter_map(|&s| servers.health.check_due(s).map(|probe| (s, probe))));
        while conns.len() < due.iter().map(|&(s, _)| s + 1).max().unwrap_or(0) {
            conns.push(Backend::new(servers.addr(conns.len())));
        }
        check_all(servers, &mut conns, &due);
        let slice = if check_ms == 0 { SLICE } else { SLICE.min(Duration::from_millis(check_ms)) };
        std::thread::sleep(slice);
    }
}

/// Checks the servers of `due` (number, whether the check is the probe),
/// each on a thread of its own when there are several, and waits for all.
fn check_all(servers: &Servers, conns: &mut [Backend], due: &[(usize, bool)]) {
    let one = |s: usize, probe: bool, conn: &mut Backend| {
        let outcome = check(servers, s, conn);
        if outcome.is_err() {
            conn.close();
        }
        servers.health.checked(s, probe, outcome.as_ref().map(|_| ()));
    };
    if let [(s, probe)] = *due {
        one(s, probe, &mut conns[s]);
        return;
    }
    let one = &one;
    std::thread::scope(|scope| {
        for (s, conn) in conns.iter_mut().enumerate() {
            let Some(&(_, probe)) = due.iter().find(|(d, _)| *d == s) else { continue };
            let named = std::thread::Builder::new().name(format!("check-{s}"));
            if let Err(e) = named.spawn_scoped(scope, move || one(s, probe, conn)) {
                // The process is out of threads: this check waits for the next look.
                tracing::warn!("no thread for a health check: {e}");
                if probe {
                    servers.health.end_probe(s);
                }
            }
        }
    });
}

/// One check of server `s` on `conn`: opened if needed (connect, TLS, and
/// the login first on a new connection), then `version`, whose reply must be
/// `VERSION ...` within the reply timeout.
fn check(servers: &Servers, s: usize, conn: &mut Backend) -> Result<(), BackendError> {
    let opened = conn.open(servers.connect_timeout(), || servers.tls(s))?;
    let deadline = Instant::now() + servers.timeout();
    let left = || deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or(BackendError::Timeout);
    let login = opened.then(|| servers.login()).flatten();
    let mut out = Vec::with_capacity(64);
    if let Some(login) = &login {
        out.extend_from_slice(login);
    }
    out.extend_from_slice(b"version\r\n");
    let mut written = 0;
    while written < out.len() {
        written += conn.write(&out[written..], left()?)?.unwrap_or(0);
    }
    while !conn.push(left()?)? {}
    let mut logged_in = login.is_none();
    loop {
        let buf = conn.buffered();
        let protocol = |e: mcproto::MalformedResponse| BackendError::Protocol(e.to_string());
        if !logged_in {
            if let Some(n) = mcproto::status_reply_len(buf).map_err(protocol)? {
                if &buf[..n] != mcproto::auth::STORED {
                    return Err(BackendError::Protocol(format!("login refused: {}", shown(&buf[..n]))));
                }
                conn.consume(n);
                logged_in = true;
                continue;
            }
        } else if let Some((reply, n)) = mcproto::parse_response(buf).map_err(protocol)? {
            return match reply {
                Response::Version(_) => {
                    conn.consume(n);
                    Ok(())
                }
                _ => Err(BackendError::Protocol(format!("version answered {}", shown(&buf[..n])))),
            };
        }
        if buf.len() > MAX_REPLY {
            return Err(BackendError::TooLarge);
        }
        conn.read(left()?)?;
    }
}

/// A reply as a log line shows it.
fn shown(reply: &[u8]) -> String {
    String::from_utf8_lossy(&reply[..reply.len().min(80)]).trim_end().to_string()
}
