//! Starting and stopping a proxy: its threads and nothing else (the state
//! they share lives in `shared.rs`, the shell every middleware has in
//! `mwserve`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use mwserve::cli::Service;
use mwserve::config::ServiceConfig;
use mwserve::listen::Front;
use mwserve::shell::{Reload, Shell, Source, Stopper};
pub use mwserve::start::StartError;

use crate::config::{Config, Engine};
use crate::credentials::Credentials;
use crate::net::NetThread;
use crate::pipeline::Pipeline;
use crate::shared::Shared;
use crate::windows::run_stats_thread;
use crate::worker::Worker;

/// A running proxy.
pub struct Proxy {
    shell: Shell,
    shared: Arc<Shared>,
    net_threads: Vec<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    checker: Option<JoinHandle<()>>,
    /// Carry the route tree's copies nobody waits for, one per side lane.
    side: Vec<JoinHandle<()>>,
}

impl Proxy {
    /// Asks the proxy to stop (what [`Service::stopper`] does).
    pub fn shutdown(&self) {
        self.stopper().stop();
    }

    /// Its state, for what reports on it from outside (twemproxy's stats port).
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

impl Service for Proxy {
    const NAME: &'static str = "mwproxy";
    const ADMIN_PATHS: &'static [&'static str] = crate::admin::PATHS;
    type Config = Config;

    fn reloads(&self, source: Source<Config>) -> Option<Reload> {
        self.shared.set_source(source);
        let shared = self.shared.clone();
        Some(Arc::new(move || {
            let read = shared.source().expect("set just before");
            crate::reload::reload(&shared, read()).map(|r| r.to_string())
        }))
    }

    fn start(config: Config) -> Result<Proxy, StartError> {
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
        let addrs =
            config.effective_routing().servers.iter().map(crate::config::resolve).collect::<Result<Vec<_>, _>>()?;
        let creds = Credentials::load(&config)?;
        let (std_listener, addr) = mwserve::listen::bind(&config.proxy.listen)?;
        if config.proxy.backlog as i32 != mwserve::listen::LISTEN_BACKLOG {
            rustix::net::listen(&std_listener, config.proxy.backlog as i32).map_err(std::io::Error::from)?;
        }
        // The main listener speaks TLS when there is a certificate; a plain one may sit beside it.
        let mut listeners = vec![(std_listener, creds.tls.is_some())];
        if let Some(plain) = &config.tls.plain_listen {
            listeners.push((mwserve::listen::bind(plain)?.0, false));
        }
        warn_if_open(&config, &listeners);
        let results = mwserve::results::open_results(&config.stats)?;
        let shared = Arc::new(Shared::new(config, addrs, fds.max_connections, creds));
        let p = &shared.config.proxy;
        let (workers_n, loops, name) = match p.engine {
            Engine::Pool => (p.workers, p.net_threads, "net"),
            Engine::Async => (0, p.loops(), "loop"),
        };
        let mut fronts = Vec::new();
        for _ in 0..loops {
            let clones = listeners.iter().map(|(l, tls)| Ok((l.try_clone()?, *tls))).collect::<std::io::Result<_>>()?;
            fronts.push(Front::new(clones, crate::net::TOO_MANY)?);
        }
        let wakers: Vec<_> = fronts.iter().map(|(_, w)| w.clone()).collect();
        let s = shared.clone();
        let stopper = Stopper::new(move || {
            s.stopping.store(true, Ordering::Relaxed);
            for w in &wakers {
                let _ = w.wake();
            }
        });
        let admin = crate::admin::routes(shared.clone());
        let s = shared.clone();
        let shell =
            Shell::start(addr.clone(), &shared.config.stats, admin, move || run_stats_thread(s, results), stopper)?;
        let s = shared.clone();
        let checker = std::thread::Builder::new().name("health-check".into()).spawn(move || crate::checker::run(s))?;
        let mut side = Vec::new();
        for lane in 0..crate::routes::queue::LANES {
            let s = shared.clone();
            side.push(
                std::thread::Builder::new()
                    .name(format!("route-side-{lane}"))
                    .spawn(move || crate::routes::side::serve(s.side.lane(lane), &s.servers))?,
            );
        }
        let mut workers = Vec::new();
        for id in 0..workers_n {
            let worker = Worker::new(id, shared.clone());
            workers.push(std::thread::Builder::new().name(format!("worker-{id}")).spawn(move || worker.run())?);
        }
        let mut net_threads = Vec::new();
        for (id, (front, _)) in fronts.into_iter().enumerate() {
            let pipeline = (p.engine == Engine::Async).then(|| Pipeline::new(id, shared.clone()));
            let net = NetThread::new(id, front, shared.clone(), pipeline);
            net_threads.push(std::thread::Builder::new().name(format!("{name}-{id}")).spawn(move || net.run())?);
        }
        tracing::info!(%addr, engine = p.engine.name(), threads = loops.max(workers_n), "mwproxy listening");
        if let Some(tree) = &shared.generation().tree {
            tracing::info!("{}", tree.summary());
        }
        Ok(Proxy { shell, shared, net_threads, workers, checker: Some(checker), side })
    }

    fn shell(&self) -> &Shell {
        &self.shell
    }

    fn join(mut self) {
        for t in self.net_threads.drain(..) {
            let _ = t.join();
        }
        self.shared.queue.close();
        for t in self.workers.drain(..) {
            let _ = t.join();
        }
        if let Some(t) = self.checker.take() {
            let _ = t.join();
        }
        self.shared.side.close();
        for t in self.side.drain(..) {
            let _ = t.join();
        }
        self.shell.finish(|| self.shared.telemetry.stop());
    }
}

/// Says loudly when a listener beyond loopback lets anyone in: no login
/// (`--auth-file`) and no client certificates (`--tls-ca`).
fn warn_if_open(config: &Config, listeners: &[(mwserve::stream::Listener, bool)]) {
    if config.auth.file.is_some() {
        return;
    }
    for (l, tls) in listeners {
        let Ok(addr) = l.local_addr() else { continue };
        let guarded = addr.is_local() || (*tls && config.tls.ca.is_some());
        if !guarded {
            tracing::warn!(
                %addr,
                "listening beyond loopback without authentication: anyone who can reach this address may \
                 read and write every key (use --auth-file, or --tls-ca with --tls-cert, or listen on loopback)"
            );
        }
    }
}
