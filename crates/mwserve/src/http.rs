//! The HTTP admin endpoint of a middleware (`--admin ADDR`): a small server
//! of its own, one request per connection, answered and closed. It never
//! touches the request path; what each path shows is the middleware's
//! business (a [`Handler`], and its [`Probes`]).
//!
//! **Probes can trust it.** Sockets that send nothing, trickle, or never
//! read their answer, and floods of probes, cannot take `/healthz` down
//! ([`serve`]): requests are read by one event loop, without a slot, within
//! [`HEADER_TIMEOUT`]; past [`MAX_CONNECTIONS`] in all or [`MAX_PER_SOURCE`]
//! from one source, a connection still reading makes room; `/healthz` is
//! answered by the loop itself, at once; `/readyz` runs one check at a time
//! and serves its answer again for [`READY_FOR`] (probes waiting for a check
//! capped at [`MAX_READY_WAITING_PER_SOURCE`] per source); pages take one
//! of [`MAX_CONCURRENT`] slots (`503` past them, `429` past
//! [`MAX_PAGES_PER_SOURCE`] for one source), and answers are written by the
//! loop within [`WRITE_TIMEOUT`].
//!
//! Requests that change something (any method but `GET`) must carry the
//! token of `[stats] admin_token_file` when one is configured — except under
//! a prefix whose pages log their users in themselves ([`Routes::own_login`]:
//! mwmq's `/ui/`, which takes the token or a user's password and hands out
//! sessions); a request that presents a wrong token hears `401` and counts
//! as a failed login ([`Routes::throttle`]); an endpoint beyond loopback
//! without a token is warned about.

mod page;
mod serve;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

pub use page::{Handler, Page, Probe, Probes, Request, Routes, MAX_BODY, MAX_HEAD, PROMETHEUS};
pub use serve::{
    HEADER_TIMEOUT, MAX_CONCURRENT, MAX_CONNECTIONS, MAX_PAGES_PER_SOURCE, MAX_PER_SOURCE, MAX_READY_WAITING,
    MAX_READY_WAITING_PER_SOURCE, READY_FOR, READY_WAIT, WRITE_TIMEOUT,
};

use crate::config::StatsConfig;
use crate::start::StartError;

/// The liveness probe's path (answered by the endpoint's loop: [`Probes::live`]).
pub const LIVENESS: &str = "/healthz";
/// The readiness probe's path ([`Probes::ready`]).
pub const READINESS: &str = "/readyz";

/// A running admin endpoint.
pub struct HttpEndpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<mio::Waker>,
    thread: JoinHandle<()>,
}

impl HttpEndpoint {
    /// Starts the endpoint `stats` asks for (`--admin`), if any: binds it
    /// and serves `routes` on a new thread.
    pub fn start_for(stats: &StatsConfig, routes: Routes) -> Result<Option<HttpEndpoint>, StartError> {
        let Some(addr) = stats.admin_addr() else { return Ok(None) };
        let token = match &stats.admin_token_file {
            Some(f) => Some(
                read_token(std::path::Path::new(f)).map_err(|e| StartError::Config(crate::config::ConfigError(e)))?,
            ),
            None => None,
        };
        let e =
            HttpEndpoint::start(&addr, routes, token.clone()).map_err(|source| StartError::Listen { addr, source })?;
        if token.is_none() && !e.addr.ip().is_loopback() {
            tracing::warn!(addr = %e.addr, "the admin endpoint listens beyond loopback WITHOUT A TOKEN: anyone who reaches it may reload the configuration (set [stats] admin_token_file)");
        }
        Ok(Some(e))
    }

    /// Binds `addr` and serves `routes` on a new thread; with `token`,
    /// requests other than `GET` must carry it (outside `routes.own_login`).
    pub fn start(addr: &str, routes: Routes, token: Option<String>) -> io::Result<HttpEndpoint> {
        let listener = TcpListener::bind(addr)?;
        // (std's backlog of 128 overflows under a burst of connecting
        // probes, and each SYN dropped costs its client a second.)
        rustix::net::listen(&listener, crate::listen::LISTEN_BACKLOG)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let endpoint = serve::Endpoint::new(listener, routes, token, stop.clone())?;
        let waker = endpoint.waker();
        let thread = std::thread::Builder::new().name("admin".into()).spawn(move || endpoint.run())?;
        tracing::info!(%addr, "admin endpoint listening");
        Ok(HttpEndpoint { addr, stop, waker, thread })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.waker.wake();
        let _ = self.thread.join();
    }
}

/// The token in the first line of `path` (which others must not be able to read).
fn read_token(path: &std::path::Path) -> Result<String, String> {
    crate::config::check_private(path, "admin token file", "chmod 600")?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("admin token file {}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.len() < 16 {
        return Err(format!("admin token file {}: the token must have at least 16 characters", path.display()));
    }
    Ok(token)
}

#[cfg(test)]
mod tests;
