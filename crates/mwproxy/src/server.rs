//! Starting and stopping a proxy: its threads and nothing else (the state
//! they share lives in `shared.rs`).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::Waker;

use crate::config::{Config, ConfigError, Engine};
use crate::net::NetThread;
use crate::pipeline::Pipeline;
use crate::shared::Shared;
use crate::telemetry::{open_results, run_stats_thread};
use crate::worker::Worker;

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration was refused.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The listening socket or a thread could not be set up.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The results directory could not be created.
    #[error("cannot write results into {0:?}: {1}")]
    Results(String, std::io::Error),
    /// The process may not open enough files.
    #[error("{0}")]
    Descriptors(String),
    /// Another set-up step failed.
    #[error("start-up failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A running proxy.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    wakers: Vec<Arc<Waker>>,
    net_threads: Vec<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    stats_thread: Option<JoinHandle<()>>,
    admin: Option<crate::admin::Admin>,
}

impl Proxy {
    /// Validates `config`, binds the listening address and starts the threads.
    pub fn start(config: Config) -> Result<Proxy, StartError> {
        config.validate()?;
        let fds = crate::fdlimit::raise_and_plan(&config).map_err(StartError::Descriptors)?;
        if fds.max_connections < config.proxy.max_connections {
            tracing::warn!(
                "max_connections {} does not fit in the open file limit {} ({} kept for server connections \
                 and the proxy): serving at most {} clients; raise the limit with `ulimit -n`",
                config.proxy.max_connections,
                fds.limit,
                fds.reserve,
                fds.max_connections
            );
        }
        let addrs = config.routing.servers.iter().map(crate::config::resolve).collect::<Result<Vec<_>, _>>()?;
        let listen = config.proxy.listen.clone();
        let std_listener = mwserve::process::bind_listener(&listen)
            .map_err(|source| StartError::Listen { addr: listen.clone(), source })?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let results = open_results(config.stats.out.as_deref(), config.stats.trace_every)
            .map_err(|e| StartError::Results(config.stats.out.clone().unwrap_or_default(), e))?;
        let shared = Arc::new(Shared::new(config, addrs, fds.max_connections));
        let admin = match shared.config.stats.admin_addr() {
            Some(a) => Some(
                crate::admin::Admin::start(&a, shared.clone())
                    .map_err(|source| StartError::Listen { addr: a, source })?,
            ),
            None => None,
        };
        let stats_shared = shared.clone();
        let stats_thread = Some(
            std::thread::Builder::new().name("stats".into()).spawn(move || run_stats_thread(stats_shared, results))?,
        );
        let p = &shared.config.proxy;
        let (workers_n, loops, name) = match p.engine {
            Engine::Pool => (p.workers, p.net_threads, "net"),
            Engine::Async => (0, p.loops(), "loop"),
        };
        let mut workers = Vec::new();
        for id in 0..workers_n {
            let worker = Worker::new(id, shared.clone());
            workers.push(std::thread::Builder::new().name(format!("worker-{id}")).spawn(move || worker.run())?);
        }
        let mut wakers = Vec::new();
        let mut net_threads = Vec::new();
        for id in 0..loops {
            let (poll, waker) = NetThread::poll_with_waker()?;
            let listener = mio::net::TcpListener::from_std(std_listener.try_clone()?);
            let pipeline = (p.engine == Engine::Async).then(|| Pipeline::new(id, shared.clone()));
            let net = NetThread::new(id, poll, listener, shared.clone(), pipeline)?;
            wakers.push(waker);
            net_threads.push(std::thread::Builder::new().name(format!("{name}-{id}")).spawn(move || net.run())?);
        }
        tracing::info!(%addr, engine = p.engine.name(), threads = loops.max(workers_n), "mwproxy listening");
        Ok(Proxy { addr, shared, wakers, net_threads, workers, stats_thread, admin })
    }

    /// The address clients connect to (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Asks the proxy to stop: no new connections, in-flight requests finish.
    pub fn shutdown(&self) {
        self.stopper().stop();
    }

    /// A handle that can ask the proxy to stop from another thread (signals).
    pub fn stopper(&self) -> Stopper {
        Stopper { shared: self.shared.clone(), wakers: self.wakers.clone() }
    }

    /// The admin endpoint's address, when it is on.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|a| a.local_addr())
    }

    /// Waits until every thread has finished (after [`Proxy::shutdown`]);
    /// the last window and summary.json are written once the workers are done.
    pub fn join(mut self) {
        for t in self.net_threads.drain(..) {
            let _ = t.join();
        }
        self.shared.queue.close();
        for t in self.workers.drain(..) {
            let _ = t.join();
        }
        self.shared.telemetry.stop();
        if let Some(t) = self.stats_thread.take() {
            let _ = t.join();
        }
        if let Some(a) = self.admin.take() {
            a.stop();
        }
    }
}

/// Stops a proxy from another thread.
#[derive(Clone)]
pub struct Stopper {
    shared: Arc<Shared>,
    wakers: Vec<Arc<Waker>>,
}

impl Stopper {
    /// Same as [`Proxy::shutdown`].
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        for w in &self.wakers {
            let _ = w.wake();
        }
    }
}
