//! The bounded pools of connections, one per database, and which server answers (failover).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::deadline::Watch;

use super::*;

/// Pool counters (cumulative).
#[derive(Debug, Default)]
pub struct PoolCounters {
    /// Borrowings that had to wait.
    pub waits: AtomicU64,
    /// Borrowings that gave up after `pool_wait_ms`.
    pub timeouts: AtomicU64,
    /// Connections opened.
    pub connects: AtomicU64,
    /// Failed attempts to open one.
    pub connect_failures: AtomicU64,
    /// Connections dropped after a failure.
    pub lost: AtomicU64,
    /// Which server answers and when none did.
    pub primary: PrimaryWatch,
}

/// Which database server mwmq writes to, and the time it spent without one:
/// from a request that found the database unavailable (connection lost or
/// refused, read-only, no answer in time) until one is answered again. A
/// failover is a connection opened on another server than the one before
/// (a multi-host `--db`, `target_session_attrs=read-write`).
#[derive(Debug, Default)]
pub struct PrimaryWatch {
    /// Since when (ns since mwmq started) no request has been answered; 0 while answered.
    down_since: AtomicU64,
    /// Time without an answering database, ns, over the periods that ended.
    down_ns: AtomicU64,
    /// Periods without one that ended.
    outages: AtomicU64,
    /// Connections opened on another server than the previous one.
    failovers: AtomicU64,
    /// The server connections were last opened on.
    server: Mutex<String>,
}

impl PrimaryWatch {
    /// A connection was opened on `server`.
    pub fn opened(&self, server: &str) {
        let mut last = self.server.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_str() != server {
            if !last.is_empty() {
                self.failovers.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(from = %last, to = %server, "the database server that accepts writes changed (failover)");
            }
            *last = server.to_string();
        }
    }

    /// A request found the database unavailable at `now` (ns).
    pub fn unavailable(&self, now: u64) {
        let _ = self.down_since.compare_exchange(0, now.max(1), Ordering::AcqRel, Ordering::Relaxed);
    }

    /// A request's statement was answered at `now` (ns).
    pub fn answered(&self, now: u64) {
        if self.down_since.load(Ordering::Relaxed) == 0 {
            return;
        }
        let since = self.down_since.swap(0, Ordering::AcqRel);
        if since != 0 {
            self.down_ns.fetch_add(now.saturating_sub(since), Ordering::Relaxed);
            self.outages.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Failovers seen.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// Periods without an answering database that ended.
    pub fn outages(&self) -> u64 {
        self.outages.load(Ordering::Relaxed)
    }

    /// Seconds without an answering database, the current period included (at `now`, ns).
    pub fn down_seconds(&self, now: u64) -> f64 {
        let since = self.down_since.load(Ordering::Relaxed);
        let current = if since == 0 { 0 } else { now.saturating_sub(since) };
        (self.down_ns.load(Ordering::Relaxed) + current) as f64 / 1e9
    }

    /// Whether requests find the database unavailable now.
    pub fn down(&self) -> bool {
        self.down_since.load(Ordering::Relaxed) != 0
    }

    /// The server connections were last opened on (`host:port`).
    pub fn server(&self) -> String {
        self.server.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

struct PoolState {
    idle: Vec<DbConn>,
    /// Connections open or being opened.
    open: usize,
    /// No new attempt before this instant (backoff).
    next_attempt: Instant,
    backoff: Duration,
    last_error: Option<String>,
}

/// The bounded pool of database connections.
pub struct Pool {
    /// The statement deadlines of its connections.
    pub watch: Arc<Watch>,
    size: usize,
    state: Mutex<PoolState>,
    freed: Condvar,
    cfg: Config,
    /// Which database (`[[databases]]`) it holds connections to.
    index: usize,
    /// Counters for the results and `/metrics`.
    pub counters: PoolCounters,
}

impl Pool {
    /// An empty pool of `cfg.pool_size()` connections (opened on demand).
    pub fn new(cfg: &Config, index: usize) -> Pool {
        Pool {
            index,
            watch: Watch::start(),
            size: cfg.pool_size(),
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
                next_attempt: Instant::now(),
                backoff: Duration::from_millis(cfg.database.retry_min_ms),
                last_error: None,
            }),
            freed: Condvar::new(),
            cfg: cfg.clone(),
            counters: PoolCounters::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connections in the pool at most.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Connections open now, and of those idle.
    pub fn occupancy(&self) -> (usize, usize) {
        let s = self.lock();
        (s.open, s.idle.len())
    }

    /// Opens connections until `n` are open (at start, so the first requests do not pay for it).
    pub fn fill(&self, n: usize) -> Result<(), String> {
        for _ in 0..n.min(self.size) {
            let c = DbConn::open(&self.cfg, self.index, &self.watch)?;
            self.counters.connects.fetch_add(1, Ordering::Relaxed);
            self.counters.primary.opened(&c.pg.server);
            let mut s = self.lock();
            s.open += 1;
            s.idle.push(c);
        }
        Ok(())
    }

    /// A connection, waiting at most `pool_wait_ms` for one to be free.
    pub fn get(&self) -> Result<DbConn, DbError> {
        let deadline = Instant::now() + Duration::from_millis(self.cfg.database.pool_wait_ms);
        let mut s = self.lock();
        let mut waited = false;
        loop {
            if let Some(c) = s.idle.pop() {
                drop(s);
                return Ok(self.armed(c));
            }
            let now = Instant::now();
            if s.open < self.size && now >= s.next_attempt {
                s.open += 1;
                drop(s);
                match DbConn::open(&self.cfg, self.index, &self.watch) {
                    Ok(c) => {
                        self.counters.connects.fetch_add(1, Ordering::Relaxed);
                        self.counters.primary.opened(&c.pg.server);
                        let mut s = self.lock();
                        s.backoff = Duration::from_millis(self.cfg.database.retry_min_ms);
                        s.last_error = None;
                        drop(s);
                        return Ok(self.armed(c));
                    }
                    Err(e) => {
                        self.counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                        let mut s = self.lock();
                        s.open -= 1;
                        s.next_attempt = Instant::now() + s.backoff;
                        s.backoff = (s.backoff * 2).min(Duration::from_millis(self.cfg.database.retry_max_ms));
                        if s.last_error.as_deref() != Some(e.as_str()) {
                            tracing::warn!("cannot connect to the database: {e}");
                        }
                        s.last_error = Some(e.clone());
                        drop(s);
                        self.freed.notify_all();
                        return Err(crate::db::unavailable(&e));
                    }
                }
            }
            if s.open < self.size {
                // Backing off after failures: fail fast rather than hold the request.
                let e = s.last_error.clone().unwrap_or_else(|| "reconnecting".into());
                return Err(crate::db::unavailable(&e));
            }
            if now >= deadline {
                self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(DbError::Unavailable(format!(
                    "no database connection became free within {} ms",
                    self.cfg.database.pool_wait_ms
                )));
            }
            if !waited {
                waited = true;
                self.counters.waits.fetch_add(1, Ordering::Relaxed);
            }
            s = self.freed.wait_timeout(s, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Runs `f` on a connection borrowed for it and given back after: its
    /// result, or why no connection could be had.
    pub fn with<T>(&self, f: impl AsyncFnOnce(&PgConn) -> T) -> Result<T, DbError> {
        let mut c = self.get()?;
        let r = c.run(f);
        self.put(c);
        Ok(r)
    }

    /// Returns a connection. A broken one is closed, and so are the idle ones
    /// (what killed one connection — a restart, a terminated backend — has
    /// usually killed them all); new ones are opened on demand.
    pub fn put(&self, c: DbConn) {
        if let Some(a) = &c.armed {
            self.watch.disarm(a);
        }
        let mut s = self.lock();
        if c.broken() {
            self.counters.lost.fetch_add(1, Ordering::Relaxed);
            let idle = std::mem::take(&mut s.idle);
            s.open -= 1 + idle.len();
            drop(s);
            drop(idle);
            drop(c);
        } else {
            s.idle.push(c);
            drop(s);
        }
        self.freed.notify_one();
    }

    /// `c`, its statements due within the deadline from now.
    fn armed(&self, c: DbConn) -> DbConn {
        if let (Some(a), Some(limit)) = (&c.armed, self.cfg.statement_deadline()) {
            self.watch.arm(a, limit);
        }
        c
    }

    /// Closes every idle connection (at shutdown).
    pub fn close(&self) {
        let mut s = self.lock();
        let idle = std::mem::take(&mut s.idle);
        s.open -= idle.len();
        drop(s);
        drop(idle);
    }
}

/// The pools of every database the queues are spread over (one with
/// `--db`), and which queue lives where ([`crate::placement`]).
pub struct Pools {
    all: Vec<Pool>,
    /// Queue name -> database.
    pub placement: crate::placement::Placement,
    /// Queues found on another database than placement names, and not on
    /// that one (created before a database was added, not moved yet by
    /// `mwmq rebalance`): served where they are. Refreshed by the directory
    /// thread, with several databases only.
    misplaced: std::sync::RwLock<std::collections::HashMap<String, usize>>,
}

impl Pools {
    /// A pool for each database of `cfg`.
    pub fn new(cfg: &Config) -> Pools {
        let list = cfg.database_list();
        Pools {
            all: (0..list.len()).map(|i| Pool::new(&cfg.for_database(i), i)).collect(),
            placement: crate::placement::Placement::of(cfg),
            misplaced: Default::default(),
        }
    }

    /// The database `queue` lives on: where placement puts it, unless it is
    /// found only on another one (not moved yet).
    pub fn home(&self, queue: &str) -> usize {
        if self.all.len() > 1 {
            if let Some(i) = self.misplaced.read().unwrap_or_else(|p| p.into_inner()).get(queue) {
                return *i;
            }
        }
        self.placement.home(queue)
    }

    /// Looks at every database's queues (`names[i]`: database i's, `None`
    /// where it did not answer: what was known of it stays) and notes those
    /// that are not where placement puts them.
    pub fn found(&self, names: &[Option<Vec<String>>]) {
        use std::collections::{HashMap, HashSet};
        let sets: Vec<Option<HashSet<&str>>> =
            names.iter().map(|n| n.as_ref().map(|n| n.iter().map(String::as_str).collect())).collect();
        let mut map = self.misplaced.write().unwrap_or_else(|p| p.into_inner());
        // What a database that did not answer held, or what its home would, is kept.
        let mut next: HashMap<String, usize> = map
            .iter()
            .filter(|(q, i)| sets[**i].is_none() || sets[self.placement.home(q)].is_none())
            .map(|(q, i)| (q.clone(), *i))
            .collect();
        for (i, set) in sets.iter().enumerate() {
            for q in set.iter().flatten() {
                let home = self.placement.home(q);
                if home != i && sets[home].as_ref().is_some_and(|h| !h.contains(q)) {
                    next.insert(q.to_string(), i);
                }
            }
        }
        *map = next;
    }

    /// Queues served where placement does not put them, now.
    pub fn misplaced(&self) -> usize {
        self.misplaced.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// How many databases.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Whether there are none (never).
    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Every pool, in configuration order.
    pub fn iter(&self) -> std::slice::Iter<'_, Pool> {
        self.all.iter()
    }

    /// Connections the pools may hold, together.
    pub fn size(&self) -> usize {
        self.all.iter().map(Pool::size).sum()
    }

    /// Connections open now, and of those idle, together.
    pub fn occupancy(&self) -> (usize, usize) {
        self.all.iter().map(Pool::occupancy).fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    }

    /// A counter added over the pools.
    pub fn sum(&self, counter: impl Fn(&PoolCounters) -> &AtomicU64) -> u64 {
        self.all.iter().map(|p| counter(&p.counters).load(Ordering::Relaxed)).sum()
    }

    /// Statements whose connection was cut at the deadline, together.
    pub fn cut(&self) -> u64 {
        self.all.iter().map(|p| p.watch.cut.load(Ordering::Relaxed)).sum()
    }

    /// Failovers seen, on every database.
    pub fn failovers(&self) -> u64 {
        self.all.iter().map(|p| p.counters.primary.failovers()).sum()
    }

    /// Periods without an answering database that ended, on every database.
    pub fn outages(&self) -> u64 {
        self.all.iter().map(|p| p.counters.primary.outages()).sum()
    }

    /// Seconds without an answering database, added over the databases.
    pub fn down_seconds(&self, now: u64) -> f64 {
        self.all.iter().map(|p| p.counters.primary.down_seconds(now)).sum()
    }

    /// Whether requests find some database unavailable now.
    pub fn down(&self) -> bool {
        self.all.iter().any(|p| p.counters.primary.down())
    }

    /// The servers connections were last opened on, one per database.
    pub fn servers(&self) -> String {
        self.all.iter().map(|p| p.counters.primary.server()).collect::<Vec<_>>().join(",")
    }

    /// Closes the idle connections of every pool.
    pub fn close(&self) {
        self.all.iter().for_each(Pool::close);
    }
}

impl std::ops::Index<usize> for Pools {
    type Output = Pool;
    fn index(&self, i: usize) -> &Pool {
        &self.all[i]
    }
}
