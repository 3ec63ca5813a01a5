//! The state every thread of a proxy shares: configuration and routing rules,
//! the servers' health and repair logs, the request queue, the memory budgets,
//! the counters and the measurements.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use mwserve::process::Throttled;

use crate::auth::Users;
use crate::budget::Budget;
use crate::config::Config;
use crate::credentials::Credentials;
use crate::exchange::Servers;
use crate::queue::WorkQueue;
use crate::route::Router;
use crate::stats::NetCounters;
use crate::telemetry::Telemetry;

/// State shared by the net threads, the workers, the stats thread and the admin endpoint.
pub struct Shared {
    /// The validated configuration.
    pub config: Config,
    /// Routing rules (placement, replication, multi-gets).
    pub router: Router,
    /// The servers: addresses, health, repair logs.
    pub servers: Servers,
    /// Who may log in (`--auth-file`); everyone when `None`.
    pub users: Option<Users>,
    /// The TLS listener's configuration (`--tls-cert`), when there is one.
    pub tls: Option<Arc<rustls::ServerConfig>>,
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
}

impl Shared {
    /// The state for `config` with servers at `addrs`.
    pub fn new(config: Config, addrs: Vec<SocketAddr>, max_connections: usize, creds: Credentials) -> Shared {
        let budget = Arc::new(Budget::new(&config.proxy));
        let queued = budget.clone();
        let work_waiting = Box::new(move || queued.queued() > 0);
        Shared {
            router: Router::new(&config, &addrs),
            queue: WorkQueue::new(config.proxy.queue_capacity),
            budget,
            net: NetCounters::default(),
            telemetry: Telemetry::new(config.proxy.carriers(), addrs.len()),
            started: Instant::now(),
            stopping: AtomicBool::new(false),
            max_connections,
            users: creds.users,
            tls: creds.tls,
            tls_log: Throttled::new("TLS handshakes failed", std::time::Duration::from_secs(10)),
            servers: {
                let servers = Servers::new(addrs, &config.backend, config.proxy.carriers(), work_waiting);
                let servers = servers.with_login(creds.login);
                match creds.server_tls {
                    Some((cfg, names)) => servers.with_tls(cfg, names),
                    None => servers,
                }
            },
            config,
        }
    }

    /// Requests waiting for a worker now.
    pub fn queue_len(&self) -> usize {
        self.budget.queued()
    }
}
