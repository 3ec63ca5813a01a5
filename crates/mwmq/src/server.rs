//! Starting and stopping mwmq: the schema, the pool, and the threads.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use mwserve::cli::Service;
use mwserve::config::ServiceConfig;
use mwserve::listen::Front;
use mwserve::shell::{Shell, Stopper};
pub use mwserve::start::StartError;

use crate::config::{Config, ConfigError};
use crate::db::Pools;
use crate::engine::net::NetThread;
use crate::engine::worker::Worker;
use crate::events::{run_listener_thread, run_notifier_thread, run_timer_thread, run_vacuum_thread};
use crate::shared::{InputBudget, Shared};
use crate::telemetry::NetCounters;
use crate::waiters::Waiters;
use crate::windows::run_stats_thread;

fn database(why: String) -> StartError {
    StartError::Dependency { what: "database", why }
}

/// A running mwmq.
pub struct Mq {
    shell: Shell,
    shared: Arc<Shared>,
    net: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    engine: Option<crate::engine::aio::Engine>,
    background: Vec<JoinHandle<()>>,
}

impl Service for Mq {
    const NAME: &'static str = "mwmq";
    const ADMIN_PATHS: &'static [&'static str] = crate::admin::PATHS;
    type Config = Config;

    /// Checks the configuration, migrates the schema, opens the pool, binds
    /// the listening address and starts the threads.
    fn start(config: Config) -> Result<Mq, StartError> {
        config.validate()?;
        config.require_database()?;
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
        let users = crate::users::Users::from_config(&config.users).map_err(|e| StartError::Config(ConfigError(e)))?;
        let tls = config.tls.server_config()?;
        // The database first: a wrong password or database fails the start
        // before the port is bound (a client never reaches a process that
        // is about to exit), and so does the schema.
        let pool = Pools::new(&config);
        for (i, entry) in config.database_list().iter().enumerate() {
            // Where it tried: a refused connection alone does not say which server refused.
            let at = crate::db::servers(&config.for_database(i));
            let named = |e: String| {
                if pool.len() > 1 {
                    format!("{:?} at {at}: {e}", entry.name)
                } else {
                    format!("{at}: {e}")
                }
            };
            let version = crate::db::migrate(&config.for_database(i)).map_err(|e| database(named(e)))?;
            // The users' rights over the SQL API, as this configuration has them.
            crate::sqlguard::publish(&config.for_database(i)).map_err(|e| database(named(e)))?;
            tracing::info!(schema = version, database = %entry.name, "database ready");
            // One connection now, as the workers will open them.
            pool[i].fill(1).map_err(|e| database(named(e)))?;
        }
        if pool.len() > 1 {
            // Queues not (yet) where placement puts them are served where they are.
            let configs: Vec<_> = (0..pool.len()).map(|i| config.for_database(i)).collect();
            let mut conns: Vec<_> = configs.iter().map(|_| None).collect();
            pool.found(&crate::events::queue_names(&configs, &mut conns));
        }
        let (std_listener, addr) = bind_tcp(&config.server.listen)?;
        // The main listener speaks TLS when there is a certificate; a plain one may sit beside it.
        let mut listeners = vec![(std_listener, tls.is_some())];
        if let Some(plain) = &config.tls.plain_listen {
            listeners.push((bind_tcp(plain)?.0, false));
        }
        let open = listeners.iter().filter_map(|(l, _)| l.local_addr().ok()).find(|a| !a.ip().is_loopback());
        if let (false, Some(open)) = (users.enabled(), open) {
            if !config.server.insecure_no_auth {
                return Err(StartError::Config(ConfigError(format!(
                    "refusing to listen on {open} without users: anyone who reaches it could read and write every \
                     queue. Add users (`mwmq user add NAME --password-stdin`, then the [[users]] table to the \
                     configuration file), listen on loopback, or accept it with --insecure-no-auth"
                ))));
            }
            tracing::warn!(%open, "listening beyond loopback WITHOUT AUTHENTICATION (--insecure-no-auth): anyone who reaches this port may read and write every queue, and any database role granted mwmq.send and mwmq.ack may send to and acknowledge on every queue");
        }
        let results = mwserve::results::open_results(&config.stats)?;
        let async_engine = config.server.engine == mwserve::config::Engine::Async;
        // The measurement slots: one per worker, or one per event loop.
        let workers = if async_engine { config.loops() } else { config.server.workers };
        let output = Arc::new(crate::output::OutputBudget::new(
            config.server.output_budget,
            std::time::Duration::from_millis(config.server.reply_stall_ms),
        ));
        let shared = Arc::new(Shared {
            queue: mwserve::queue::WorkQueue::new(config.server.queue_capacity),
            pool,
            waiters: Waiters::new(config.database.notify),
            telemetry: crate::telemetry::telemetry(workers),
            net: NetCounters::default(),
            stopping: AtomicBool::new(false),
            max_connections: fds.max_connections,
            open_connections: AtomicUsize::new(0),
            input: InputBudget::new(config.server.input_budget),
            reply_line: crate::output::Line::new(&output),
            output,
            bounds: crate::output::Bounds::new(&config),
            started: Instant::now(),
            done: Mutex::new(None),
            port: addr.port(),
            users,
            logins: crate::logins::Logins::new(config.auth.login_queue, config.auth.throttle()),
            queues: Default::default(),
            info_cache: Default::default(),
            paused: Default::default(),
            not_plain: Default::default(),
            prioritized: Default::default(),
            being_marked: Default::default(),
            rates: Default::default(),
            vacuums: Default::default(),
            stream_replies: Default::default(),
            tls,
            tls_log: mwserve::process::Throttled::new("TLS handshakes failed", std::time::Duration::from_secs(10)),
            config,
        });
        // The engine; what a stop must wake besides the parked RECVs.
        let (engine, pool_front, wake): (_, _, Box<dyn Fn() + Send + Sync>) = if async_engine {
            let engine = crate::engine::aio::Engine::start(shared.clone(), listeners, workers)?;
            let stop_loops = engine.stopper();
            (Some(engine), None, Box::new(stop_loops))
        } else {
            let listeners = listeners.into_iter().map(|(l, tls)| (l.into(), tls)).collect();
            let (front, waker) = Front::new(listeners, crate::engine::net::TOO_MANY)?;
            let w = waker.clone();
            (None, Some((front, waker)), Box::new(move || drop(w.wake())))
        };
        // Stopping: no new connections or requests; parked RECVs are answered
        // now; in-flight requests finish.
        let s = shared.clone();
        let stopper = Stopper::new(move || {
            s.stopping.store(true, Ordering::Relaxed);
            s.waiters.stop(&s.queue);
            wake();
        });
        let admin = crate::admin::routes(shared.clone());
        let s = shared.clone();
        let shell =
            Shell::start(addr.into(), &shared.config.stats, admin, move || run_stats_thread(s, results), stopper)?;
        let mut background = start_background(&shared)?;
        let Some((front, waker)) = pool_front else {
            tracing::info!(%addr, loops = workers, "mwmq listening (async engine)");
            return Ok(Mq { shell, shared, net: None, workers: Vec::new(), engine, background });
        };
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| std::thread::Builder::new().name(name.into()).spawn(f);
        let mut handles = Vec::new();
        for id in 0..workers {
            let w = Worker::new(id, shared.clone());
            handles.push(spawn(&format!("worker-{id}"), Box::new(move || w.run()))?);
        }
        if shared.users.enabled() {
            for i in 0..shared.config.auth.login_threads {
                let s = shared.clone();
                background
                    .push(spawn(&format!("login-{i}"), Box::new(move || crate::engine::worker::run_login_thread(s)))?);
            }
        }
        // Bounded: a connection has at most one request with the workers, so
        // at most a word or two about it wait here (the net thread may hand
        // out the next request before it reads the word about the last); a
        // send into a full channel waits rather than growing memory. (Its
        // slots are allocated up front: 16 bytes each.)
        let (tx, rx) = crossbeam_channel::bounded(4 * shared.max_connections.max(1));
        *shared.done.lock().unwrap_or_else(|p| p.into_inner()) = Some((tx, waker));
        let net = NetThread::new(front, shared.clone(), rx);
        let net = Some(spawn("net", Box::new(move || net.run()))?);
        tracing::info!(%addr, "mwmq listening");
        Ok(Mq { shell, shared, net, workers: handles, engine, background })
    }

    fn shell(&self) -> &Shell {
        &self.shell
    }

    /// Waits until every thread has finished (after [`Stopper::stop`]): the
    /// net thread answers what is in flight and closes the connections, the
    /// workers finish the queue (giving back leases of undelivered replies),
    /// then the last window and summary.json are written.
    fn join(mut self) {
        if let Some(t) = self.net.take() {
            let _ = t.join();
        }
        if let Some(e) = self.engine.take() {
            e.join();
        }
        self.shared.queue.close();
        for t in self.workers.drain(..) {
            let _ = t.join();
        }
        for t in self.background.drain(..) {
            let _ = t.join();
        }
        self.shared.pool.close();
        self.shell.finish(|| self.shared.telemetry.stop());
    }
}

/// The threads both engines have: the timer (the ends of waits) and the
/// poller (the shared poll of what they wait for),
/// the notifier and listener (other processes' messages), the vacuum, the
/// purge and the ticker (schedules' messages) of each database.
fn start_background(shared: &Arc<Shared>) -> std::io::Result<Vec<JoinHandle<()>>> {
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| std::thread::Builder::new().name(name.into()).spawn(f);
    let mut background = Vec::new();
    let s = shared.clone();
    background.push(spawn("timer", Box::new(move || run_timer_thread(s)))?);
    let s = shared.clone();
    background.push(spawn("poller", Box::new(move || crate::poller::run_poller_thread(s)))?);
    let s = shared.clone();
    background.push(spawn("notifier", Box::new(move || run_notifier_thread(s)))?);
    let s = shared.clone();
    background.push(spawn("rates", Box::new(move || crate::events::run_rates_thread(s)))?);
    if shared.pool.len() > 1 {
        let s = shared.clone();
        background.push(spawn("directory", Box::new(move || crate::events::run_directory_thread(s)))?);
    }
    for db in 0..shared.pool.len() {
        if shared.config.queues.vacuum_s > 0 {
            // Not joined: a long VACUUM need not hold up a stop; the thread
            // ends by itself once it sees the stop.
            let s = shared.clone();
            spawn(&format!("vacuum-{db}"), Box::new(move || run_vacuum_thread(s, db)))?;
        }
        if shared.config.database.notify {
            let s = shared.clone();
            background.push(spawn(&format!("listener-{db}"), Box::new(move || run_listener_thread(s, db)))?);
        }
        let s = shared.clone();
        background.push(spawn(&format!("purge-{db}"), Box::new(move || crate::events::run_purge_thread(s, db)))?);
        let s = shared.clone();
        background.push(spawn(&format!("ticker-{db}"), Box::new(move || crate::ticker::run_ticker_thread(s, db)))?);
    }
    Ok(background)
}

/// Binds a TCP listening socket: mwmq's clients connect over TCP (a unix
/// socket's path is refused by name).
fn bind_tcp(addr: &str) -> Result<(std::net::TcpListener, std::net::SocketAddr), StartError> {
    let refused = || StartError::Config(ConfigError(format!("listen {addr:?}: mwmq listens on TCP (host:port) only")));
    if mwserve::stream::is_unix_path(addr) {
        return Err(refused());
    }
    match mwserve::listen::bind(addr)? {
        (mwserve::stream::Listener::Tcp(l), mwserve::stream::Addr::Tcp(a)) => Ok((l, a)),
        _ => Err(refused()),
    }
}
