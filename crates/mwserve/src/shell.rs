//! What every running middleware has besides its own threads: the address
//! it listens on, the stats thread that closes the windows, and the admin
//! endpoint.

use std::net::SocketAddr;
use std::thread::JoinHandle;

use crate::config::StatsConfig;
use crate::http::{Handler, HttpEndpoint};
use crate::start::StartError;

/// A running middleware's shell.
pub struct Shell {
    addr: SocketAddr,
    stats: Option<JoinHandle<()>>,
    admin: Option<HttpEndpoint>,
}

impl Shell {
    /// Starts the admin endpoint `cfg` asks for (serving `paths` with
    /// `handler`) and the stats thread (running `stats`), for a middleware
    /// listening on `addr`.
    pub fn start(
        addr: SocketAddr,
        cfg: &StatsConfig,
        paths: &'static [&'static str],
        handler: Handler,
        stats: impl FnOnce() + Send + 'static,
    ) -> Result<Shell, StartError> {
        let admin = HttpEndpoint::start_for(cfg, paths, handler)?;
        let stats = Some(std::thread::Builder::new().name("stats".into()).spawn(stats)?);
        Ok(Shell { addr, stats, admin })
    }

    /// The address clients connect to (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin endpoint's address, when it is on.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(HttpEndpoint::local_addr)
    }

    /// Once the middleware's own threads are done: `stop_stats` asks the
    /// stats thread to close the last window and write the summary; this
    /// waits for it, then stops the admin endpoint.
    pub fn finish(mut self, stop_stats: impl FnOnce()) {
        stop_stats();
        if let Some(t) = self.stats.take() {
            let _ = t.join();
        }
        if let Some(a) = self.admin.take() {
            a.stop();
        }
    }
}
