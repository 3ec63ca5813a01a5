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
use crate::stats::NetCounters;
use crate::telemetry::{open_results, run_stats_thread, Telemetry};
use crate::worker::{Job, Worker};
use mcproto::ring::Ring;

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
    /// Connection counters of the net threads.
    pub net: NetCounters,
    /// Per-request measurements and their windows.
    pub telemetry: Telemetry,
    /// When the proxy started (monotonic).
    pub started: Instant,
    /// Set once to ask every thread to finish.
    pub stopping: AtomicBool,
    /// The queue's receiving end, kept to report its length.
    queue: Receiver<Job>,
}

impl Shared {
    /// Requests waiting in the queue now.
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }
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
    /// The results directory could not be created.
    #[error("cannot write results into {0:?}: {1}")]
    Results(String, std::io::Error),
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
    stats_thread: Option<JoinHandle<()>>,
    admin: Option<crate::admin::Admin>,
}

impl Proxy {
    /// Validates `config`, binds the listening address and starts the threads.
    pub fn start(config: Config) -> Result<Proxy, StartError> {
        config.validate()?;
        let addrs = config.routing.servers.iter().map(crate::config::resolve).collect::<Result<Vec<_>, _>>()?;
        let listen = config.proxy.listen.clone();
        let std_listener = std::net::TcpListener::bind(&listen)
            .map_err(|source| StartError::Listen { addr: listen.clone(), source })?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let results = open_results(config.stats.out.as_deref(), config.stats.trace_every)
            .map_err(|e| StartError::Results(config.stats.out.clone().unwrap_or_default(), e))?;
        let (tx, rx) = bounded::<Job>(config.proxy.queue_capacity);
        let shared = Arc::new(Shared {
            ring: Ring::new(config.routing.hash.ring_kind(), &config.routing.servers),
            health: addrs.iter().map(|_| Health::default()).collect(),
            net: NetCounters::default(),
            telemetry: Telemetry::new(config.proxy.workers, addrs.len()),
            addrs,
            started: Instant::now(),
            stopping: AtomicBool::new(false),
            queue: rx.clone(),
            config,
        });
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
            let net = NetThread::new(id, poll, listener, tx.clone(), shared.clone())?;
            wakers.push(waker);
            threads.push(std::thread::Builder::new().name(format!("net-{id}")).spawn(move || net.run())?);
        }
        tracing::info!(%addr, "mwproxy listening");
        Ok(Proxy { addr, shared, wakers, threads, stats_thread, admin })
    }

    /// The address clients connect to (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
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

    /// The admin endpoint's address, when it is on.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|a| a.local_addr())
    }

    /// Waits until every thread has finished (after [`Proxy::shutdown`]);
    /// the last window and summary.json are written once the workers are done.
    pub fn join(mut self) {
        for t in self.threads.drain(..) {
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

/// The figures of the plain `stats` command, in memcached's order where it has them.
pub fn general_stats(shared: &Shared) -> Vec<(String, String)> {
    let uptime = shared.started.elapsed();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let live = shared.telemetry.live(&shared.net);
    let total = shared.net.values();
    let open = NetCounters::value_of(&total, "total_connections") - NetCounters::value_of(&total, "closed_connections");
    let cfg = &shared.config;
    let mut v: Vec<(String, String)> = vec![
        ("pid".into(), std::process::id().to_string()),
        ("uptime".into(), uptime.as_secs().to_string()),
        ("time".into(), now.to_string()),
        ("version".into(), crate::VERSION.to_string()),
        ("pointer_size".into(), (8 * std::mem::size_of::<usize>()).to_string()),
        ("curr_connections".into(), open.to_string()),
        ("max_connections".into(), cfg.proxy.max_connections.to_string()),
        ("threads".into(), cfg.proxy.workers.to_string()),
        ("net_threads".into(), cfg.proxy.net_threads.to_string()),
        ("queue_capacity".into(), cfg.proxy.queue_capacity.to_string()),
        ("queue_length".into(), shared.queue.len().to_string()),
    ];
    for name in NetCounters::NAMES {
        v.push((name.to_string(), NetCounters::value_of(&live.net, name).to_string()));
    }
    v.push(("requests".into(), live.requests.to_string()));
    for (name, value) in crate::stats::WorkerCounters::NAMES.iter().zip(live.counters.values()) {
        v.push((name.to_string(), value.to_string()));
    }
    let capacity = cfg.proxy.workers as f64 * uptime.as_nanos() as f64;
    let util = if capacity > 0.0 { live.busy_ns as f64 / capacity } else { 0.0 };
    v.push(("worker_utilization".into(), format!("{util:.4}")));
    v.push(("servers".into(), shared.addrs.len().to_string()));
    let now_ms = uptime.as_millis() as u64;
    let down = shared.health.iter().filter(|h| !h.is_up(now_ms) || h.failing()).count();
    v.push(("servers_down".into(), down.to_string()));
    v.push(("replication".into(), cfg.routing.replication.to_string()));
    v
}
