//! Starting and stopping a proxy: the state all threads share, the threads
//! themselves, and the general `stats` figures.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{bounded, Receiver};
use mio::Waker;

use crate::backend::Health;
use crate::config::{Config, ConfigError};
use crate::net::NetThread;
use crate::ring::Ring;
use crate::stats::Registry;
use crate::worker::{Job, Worker};

/// State shared by the net threads and the workers.
pub struct Shared {
    /// The validated configuration.
    pub config: Config,
    /// Key placement.
    pub ring: Ring,
    /// Resolved server addresses, in configuration order.
    pub addrs: Vec<SocketAddr>,
    /// Liveness of each server.
    pub health: Vec<Health>,
    /// Counters.
    pub stats: Registry,
    /// When the proxy started (monotonic).
    pub started: Instant,
    /// Set once to ask every thread to finish.
    pub stopping: AtomicBool,
    /// The queue's receiving end, kept to report its length.
    queue: Receiver<Job>,
}

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
    /// Another set-up step failed.
    #[error("start-up failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A running proxy.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    wakers: Vec<Arc<Waker>>,
    threads: Vec<JoinHandle<()>>,
}

impl Proxy {
    /// Validates `config`, binds the listening address and starts the threads.
    pub fn start(config: Config) -> Result<Proxy, StartError> {
        config.validate()?;
        let addrs = config.routing.servers.iter().map(|s| s.resolve()).collect::<Result<Vec<_>, _>>()?;
        let listen = config.proxy.listen.clone();
        let std_listener = std::net::TcpListener::bind(&listen)
            .map_err(|source| StartError::Listen { addr: listen.clone(), source })?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let (tx, rx) = bounded::<Job>(config.proxy.queue_capacity);
        let shared = Arc::new(Shared {
            ring: Ring::new(config.routing.hash, &config.routing.servers),
            health: addrs.iter().map(|_| Health::default()).collect(),
            stats: Registry::new(config.proxy.workers, addrs.len()),
            addrs,
            started: Instant::now(),
            stopping: AtomicBool::new(false),
            queue: rx.clone(),
            config,
        });
        let mut threads = Vec::new();
        for id in 0..shared.config.proxy.workers {
            let worker = Worker::new(id, shared.clone());
            let rx = rx.clone();
            threads.push(std::thread::Builder::new().name(format!("worker-{id}")).spawn(move || worker.run(rx))?);
        }
        let mut wakers = Vec::new();
        for id in 0..shared.config.proxy.net_threads {
            let (poll, waker) = NetThread::poll_with_waker()?;
            let listener = mio::net::TcpListener::from_std(std_listener.try_clone()?);
            let net = NetThread::new(poll, listener, tx.clone(), shared.clone())?;
            wakers.push(waker);
            threads.push(std::thread::Builder::new().name(format!("net-{id}")).spawn(move || net.run())?);
        }
        tracing::info!(%addr, "mwproxy listening");
        Ok(Proxy { addr, shared, wakers, threads })
    }

    /// The address clients connect to (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The state shared by the proxy's threads (counters, health).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Asks the proxy to stop: no new connections, in-flight requests finish.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        for w in &self.wakers {
            let _ = w.wake();
        }
    }

    /// A handle that can ask the proxy to stop from another thread (signals).
    pub fn stopper(&self) -> Stopper {
        Stopper { shared: self.shared.clone(), wakers: self.wakers.clone() }
    }

    /// Waits until every thread has finished (after [`Proxy::shutdown`]).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
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

/// The figures of the plain `stats` command, in memcached's order where it has them.
pub fn general_stats(shared: &Shared) -> Vec<(String, String)> {
    let uptime = shared.started.elapsed();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let net = shared.stats.net_totals();
    let get = |name: &str| net.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).unwrap_or(0);
    let cfg = &shared.config;
    let mut v: Vec<(String, String)> = vec![
        ("pid".into(), std::process::id().to_string()),
        ("uptime".into(), uptime.as_secs().to_string()),
        ("time".into(), now.to_string()),
        ("version".into(), crate::VERSION.to_string()),
        ("pointer_size".into(), (8 * std::mem::size_of::<usize>()).to_string()),
        ("curr_connections".into(), (get("total_connections") - get("closed_connections")).to_string()),
        ("max_connections".into(), cfg.proxy.max_connections.to_string()),
        ("threads".into(), cfg.proxy.workers.to_string()),
        ("net_threads".into(), cfg.proxy.net_threads.to_string()),
        ("queue_capacity".into(), cfg.proxy.queue_capacity.to_string()),
        ("queue_length".into(), shared.queue.len().to_string()),
    ];
    v.extend(net.iter().map(|(n, x)| (n.to_string(), x.to_string())));
    let workers = shared.stats.worker_totals();
    let busy = workers.iter().find(|(n, _)| *n == "busy_ns").map(|(_, v)| *v).unwrap_or(0);
    v.extend(workers.iter().map(|(n, x)| (n.to_string(), x.to_string())));
    let capacity = cfg.proxy.workers as f64 * uptime.as_nanos() as f64;
    v.push(("worker_utilization".into(), format!("{:.4}", if capacity > 0.0 { busy as f64 / capacity } else { 0.0 })));
    v.push(("servers".into(), shared.addrs.len().to_string()));
    let now_ms = uptime.as_millis() as u64;
    let down = shared.health.iter().filter(|h| !h.is_up(now_ms) || h.failing()).count();
    v.push(("servers_down".into(), down.to_string()));
    v.push(("replication".into(), cfg.routing.replication.to_string()));
    v
}
