//! Starting and stopping mwmq: the schema, the pool, and the threads.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use mio::Waker;

use crate::config::{Config, ConfigError};
use crate::db::Pool;
use crate::events::{run_listener_thread, run_notifier_thread, run_timer_thread, Waiters};
use crate::net::NetThread;
use crate::shared::{InputBudget, NetCounters, Shared};
use crate::telemetry::{open_results, run_stats_thread, Telemetry};
use crate::worker::Worker;

/// Why mwmq could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration was refused.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The database could not be reached or its schema set up.
    #[error("database: {0}")]
    Database(String),
    /// The listening socket could not be set up.
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

/// A running mwmq.
pub struct Mq {
    addr: SocketAddr,
    shared: Arc<Shared>,
    waker: Arc<Waker>,
    net: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
    stats: Option<JoinHandle<()>>,
    admin: Option<crate::admin::Admin>,
}

impl Mq {
    /// Checks the configuration, migrates the schema, opens the pool, binds
    /// the listening address and starts the threads.
    pub fn start(config: Config) -> Result<Mq, StartError> {
        config.validate()?;
        let own = config.pool_size() as u64 + 2 + 4;
        let fds = mwserve::fdlimit::plan(
            mwserve::fdlimit::raise_soft_limit(),
            own,
            "the database pool and mwmq's own connections",
            config.server.max_connections,
        )
        .map_err(StartError::Descriptors)?;
        if fds.max_connections < config.server.max_connections {
            tracing::warn!(
                "max_connections {} does not fit in the open file limit {}: serving at most {} clients; \
                 raise the limit with `ulimit -n`",
                config.server.max_connections,
                fds.limit,
                fds.max_connections
            );
        }
        let version = crate::db::migrate(&config).map_err(StartError::Database)?;
        tracing::info!(schema = version, "database ready");
        let pool = Pool::new(&config);
        // One connection now: a wrong password or database fails the start, not the first request.
        pool.fill(1).map_err(StartError::Database)?;
        let listen = config.server.listen.clone();
        let std_listener = mwserve::process::bind_listener(&listen)
            .map_err(|source| StartError::Listen { addr: listen.clone(), source })?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let results = open_results(config.stats.out.as_deref(), config.stats.trace_every)
            .map_err(|e| StartError::Results(config.stats.out.clone().unwrap_or_default(), e))?;
        let workers = config.server.workers;
        let shared = Arc::new(Shared {
            queue: mwserve::queue::WorkQueue::new(config.server.queue_capacity),
            pool,
            waiters: Waiters::default(),
            telemetry: Telemetry::new(workers),
            net: NetCounters::default(),
            stopping: AtomicBool::new(false),
            max_connections: fds.max_connections,
            open_connections: AtomicUsize::new(0),
            input: InputBudget::new(config.server.input_budget),
            started: Instant::now(),
            done: Mutex::new(None),
            port: addr.port(),
            config,
        });
        let admin = match shared.config.stats.admin.as_deref().map(mwserve::process::admin_addr) {
            Some(a) => Some(
                crate::admin::Admin::start(&a, shared.clone())
                    .map_err(|source| StartError::Listen { addr: a, source })?,
            ),
            None => None,
        };
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| std::thread::Builder::new().name(name.into()).spawn(f);
        let s = shared.clone();
        let stats = Some(spawn("stats", Box::new(move || run_stats_thread(s, results)))?);
        let mut handles = Vec::new();
        for id in 0..workers {
            let w = Worker::new(id, shared.clone());
            handles.push(spawn(&format!("worker-{id}"), Box::new(move || w.run()))?);
        }
        let mut background = Vec::new();
        let s = shared.clone();
        background.push(spawn("timer", Box::new(move || run_timer_thread(s)))?);
        let s = shared.clone();
        background.push(spawn("notifier", Box::new(move || run_notifier_thread(s)))?);
        if shared.config.database.notify {
            let s = shared.clone();
            background.push(spawn("listener", Box::new(move || run_listener_thread(s)))?);
        }
        let (poll, waker) = NetThread::poll_with_waker()?;
        let (tx, rx) = crossbeam_channel::unbounded();
        *shared.done.lock().unwrap_or_else(|p| p.into_inner()) = Some((tx, waker.clone()));
        let listener = mio::net::TcpListener::from_std(std_listener);
        let net = NetThread::new(poll, listener, shared.clone(), rx)?;
        let net = Some(spawn("net", Box::new(move || net.run()))?);
        tracing::info!(%addr, "mwmq listening");
        Ok(Mq { addr, shared, waker, net, workers: handles, background, stats, admin })
    }

    /// The address clients connect to (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin endpoint's address, when it is on.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|a| a.local_addr())
    }

    /// A handle that stops mwmq from another thread (signals).
    pub fn stopper(&self) -> Stopper {
        Stopper { shared: self.shared.clone(), waker: self.waker.clone() }
    }

    /// Waits until every thread has finished (after [`Stopper::stop`]): the
    /// net thread answers what is in flight and closes the connections, the
    /// workers finish the queue (giving back leases of undelivered replies),
    /// then the last window and summary.json are written.
    pub fn join(mut self) {
        if let Some(t) = self.net.take() {
            let _ = t.join();
        }
        self.shared.queue.close();
        for t in self.workers.drain(..) {
            let _ = t.join();
        }
        for t in self.background.drain(..) {
            let _ = t.join();
        }
        self.shared.pool.close();
        self.shared.telemetry.stop();
        if let Some(t) = self.stats.take() {
            let _ = t.join();
        }
        if let Some(a) = self.admin.take() {
            a.stop();
        }
    }
}

/// Stops mwmq from another thread.
#[derive(Clone)]
pub struct Stopper {
    shared: Arc<Shared>,
    waker: Arc<Waker>,
}

impl Stopper {
    /// No new connections or requests; parked RECVs are answered now;
    /// in-flight requests finish.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.shared.waiters.stop(&self.shared);
        let _ = self.waker.wake();
    }
}
