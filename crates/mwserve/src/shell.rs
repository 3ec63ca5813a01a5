//! What every running middleware has besides its own threads: the address
//! it listens on, the stats thread that closes the windows, and the admin
//! endpoint.

use std::net::SocketAddr;
use std::thread::JoinHandle;

use crate::config::StatsConfig;
use crate::http::{HttpEndpoint, Routes};
use crate::start::StartError;
use crate::stream::Addr;

/// A running middleware's shell.
pub struct Shell {
    addr: Addr,
    stats: Option<JoinHandle<()>>,
    admin: Option<HttpEndpoint>,
    stopper: Stopper,
}

impl Shell {
    /// Starts the admin endpoint `cfg` asks for (serving `routes`) and the
    /// stats thread (running `stats`), for a middleware listening on `addr`
    /// that `stopper` stops.
    pub fn start(
        addr: Addr,
        cfg: &StatsConfig,
        routes: Routes,
        stats: impl FnOnce() + Send + 'static,
        stopper: Stopper,
    ) -> Result<Shell, StartError> {
        let admin = HttpEndpoint::start_for(cfg, routes)?;
        let stats = Some(std::thread::Builder::new().name("stats".into()).spawn(stats)?);
        Ok(Shell { addr, stats, admin, stopper })
    }

    /// What stops the middleware.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// The address clients connect to (useful with port 0).
    pub fn addr(&self) -> &Addr {
        &self.addr
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
        if let Addr::Unix(path) = &self.addr {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Asks a running middleware to stop, from any thread.
#[derive(Clone)]
pub struct Stopper(std::sync::Arc<dyn Fn() + Send + Sync>);

impl Stopper {
    /// A stopper that calls `stop`.
    pub fn new(stop: impl Fn() + Send + Sync + 'static) -> Stopper {
        Stopper(std::sync::Arc::new(stop))
    }

    /// Asks the middleware to stop (it may be asked more than once).
    pub fn stop(&self) {
        (self.0)()
    }
}

/// Reads a middleware's configuration again: the file named at start, with
/// the command line's flags over it; a refusal says why.
pub type Source<C> = std::sync::Arc<dyn Fn() -> Result<C, String> + Send + Sync>;

/// Reloads a running middleware's configuration: what changed, or why the
/// running one was kept.
pub type Reload = std::sync::Arc<dyn Fn() -> Result<String, String> + Send + Sync>;
