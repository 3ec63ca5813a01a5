//! The state every thread of a proxy shares: configuration and routing rules,
//! the servers' health and repair logs, the request queue, the memory budgets,
//! the counters and the measurements.

use mwserve::stream::Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mwserve::process::Throttled;
use mwserve::shell::Source;

use arc_swap::ArcSwap;

use crate::budget::Budget;
use crate::config::Config;
use crate::credentials::Credentials;
use crate::exchange::Servers;
use crate::generation::Generation;
use crate::queue::WorkQueue;
use crate::stats::NetCounters;
use crate::telemetry::Telemetry;

/// State shared by the net threads, the workers, the stats thread and the admin endpoint.
pub struct Shared {
    /// The configuration at start. What cannot change while running
    /// (listen address, engine, threads, budgets, stats) is read here; what a
    /// reload changes is read from the current [`Generation`].
    pub config: Config,
    /// The configuration in use, swapped by a reload.
    generation: ArcSwap<Generation>,
    /// Its id, set after it is swapped in: a thread that holds this one
    /// learns so from a plain load, without touching the swap.
    installed: AtomicU64,
    /// The servers: addresses, health, repair logs.
    pub servers: Servers,
    /// Failed TLS handshakes, logged at most every 10 s.
    pub tls_log: Throttled,
    /// Connections waiting for a worker.
    pub queue: WorkQueue,
    /// Memory budgets of the connections.
    pub budget: Arc<Budget>,
    /// Connection counters of the net threads.
    pub net: NetCounters,
    /// Per-request measurements and their windows.
    pub telemetry: Telemetry,
    /// When the proxy started (monotonic).
    pub started: Instant,
    /// Set once to ask every thread to finish.
    pub stopping: AtomicBool,
    /// Client connections served at once (`max_connections`, lowered to fit
    /// the file descriptor limit).
    pub max_connections: usize,
    /// Failed logins per source and per user name (shared with the admin
    /// endpoint, where a wrong admin token counts too).
    pub logins: Arc<mwserve::throttle::Throttle>,
    /// Where a reload reads the configuration (set by `main`).
    source: Mutex<Option<Source<Config>>>,
    /// Copies of requests nobody waits for (route trees' shadows, ...).
    pub side: Arc<crate::routes::queue::Lanes<crate::routes::tree::Detached>>,
}

impl Shared {
    /// The state for `config` with servers at `addrs`.
    pub fn new(config: Config, addrs: Vec<Addr>, max_connections: usize, creds: Credentials) -> Shared {
        let budget = Arc::new(Budget::new(&config.proxy));
        let queued = budget.clone();
        let work_waiting = Box::new(move || queued.queued() > 0);
        let servers = Servers::for_start(addrs.len(), &config.backend, config.proxy.carriers(), work_waiting);
        let ids = servers.register(&creds.endpoints(&addrs)).expect("the first servers fit");
        servers.set_login(creds.login);
        servers.set_tls(creds.server_tls.map(|(cfg, _)| cfg));
        let side = Arc::new(crate::routes::queue::Lanes::with_budget(config.proxy.memory_budget as u64));
        let generation = Generation::new(1, config.clone(), &addrs, ids, creds.users, creds.tls)
            .ejecting(servers.health.ejection.clone())
            .routed(&side, servers.health.ejection.clone(), None);
        Shared {
            queue: WorkQueue::new(config.proxy.queue_capacity),
            budget,
            net: NetCounters::default(),
            telemetry: Telemetry::new(config.proxy.carriers(), addrs.len()),
            started: Instant::now(),
            stopping: AtomicBool::new(false),
            max_connections,
            tls_log: Throttled::new("TLS handshakes failed", std::time::Duration::from_secs(10)),
            logins: Arc::new(mwserve::throttle::Throttle::new(config.auth.throttle())),
            servers,
            installed: AtomicU64::new(generation.id),
            generation: ArcSwap::from_pointee(generation),
            source: Mutex::new(None),
            side,
            config,
        }
    }

    /// The configuration in use now.
    pub fn generation(&self) -> Arc<Generation> {
        self.generation.load_full()
    }

    /// Brings a thread's copy of the configuration in use up to date; true
    /// when it changed. (Looking costs no write to shared memory; only a
    /// change takes a reference.)
    pub fn refresh(&self, current: &mut Arc<Generation>) -> bool {
        match self.changed(current) {
            Some(now) => {
                *current = now;
                true
            }
            None => false,
        }
    }

    /// The configuration in use, if it is not `current`.
    pub fn changed(&self, current: &Arc<Generation>) -> Option<Arc<Generation>> {
        if self.installed.load(Ordering::Acquire) == current.id {
            return None;
        }
        let now = self.generation.load_full();
        (!Arc::ptr_eq(&now, current)).then_some(now)
    }

    /// Puts `next` in use: requests routed from now on take it.
    pub fn install(&self, next: Generation) {
        let id = next.id;
        self.generation.store(Arc::new(next));
        self.installed.store(id, Ordering::Release);
    }

    /// Reloads read the configuration from `source`.
    pub fn set_source(&self, source: Source<Config>) {
        *self.source.lock().unwrap_or_else(|p| p.into_inner()) = Some(source);
    }

    /// Where reloads read the configuration, if anywhere.
    pub fn source(&self) -> Option<Source<Config>> {
        self.source.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Requests waiting for a worker now.
    pub fn queue_len(&self) -> usize {
        self.budget.queued()
    }
}
