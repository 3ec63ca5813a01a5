//! mwmq's configuration: one struct per section, documented defaults, a
//! `validate()` that explains every refusal, and TOML loading that rejects
//! unknown keys. Command-line flags (`cli.rs`) override the file.

use serde::{Deserialize, Serialize};

pub use mwserve::config::{ConfigError, ServiceConfig, StatsConfig, TlsConfig};

/// Everything mwmq needs to run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where clients connect, and the threads that serve them.
    pub server: ServerConfig,
    /// The PostgreSQL database and the pool of connections to it.
    pub database: DatabaseConfig,
    /// Queue behaviour: leases, long polls, deduplication.
    pub queues: QueuesConfig,
    /// Measurement outputs.
    pub stats: StatsConfig,
    /// TLS on the clients' side (`--tls-cert`, `--tls-key`, `--tls-ca`, `--plain-listen`).
    pub tls: TlsConfig,
    /// How logins are checked and throttled (with `[[users]]`).
    pub auth: AuthConfig,
    /// Who may connect (`[[users]]`; `mwmq user add` makes an entry). With
    /// none, anyone may, and mwmq listens on loopback only unless told
    /// `--insecure-no-auth`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<crate::users::UserConfig>,
    /// Several PostgreSQL clusters to spread the queues over (instead of
    /// `database.url`): each queue lives on one, chosen by rendezvous hashing
    /// of its name (`placement.rs`). The `[database]` settings apply to each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<DatabaseEntry>,
}

/// One of the databases the queues are spread over.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseEntry {
    /// Its name: what placement hashes (renaming it moves its queues;
    /// changing its connection string, e.g. to a new host, does not).
    pub name: String,
    /// A libpq connection string or URL, as `database.url`.
    pub url: String,
    /// Place no queue here (its queues are served where they are until
    /// `mwmq rebalance` moves them to the others): the way to remove it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
}

/// Most databases in `[[databases]]`.
pub const MAX_DATABASES: usize = 64;

/// The largest `max_reply_bytes` (4 GiB: beyond it a reply bounds nothing).
pub const MAX_REPLY_BYTES: usize = 4 << 30;

impl Config {
    /// Whether the configuration holds secrets: users' password hashes, or a
    /// password in a database connection string.
    pub fn has_secrets(&self) -> bool {
        let secret = |u: &str| mwstats::redact::redact(u) != u;
        !self.users.is_empty() || secret(&self.database.url) || self.databases.iter().any(|d| secret(&d.url))
    }

    /// The databases queues are placed on: `[[databases]]`, or the one of
    /// `database.url` (named `main`).
    pub fn database_list(&self) -> Vec<DatabaseEntry> {
        if self.databases.is_empty() {
            vec![DatabaseEntry { name: "main".into(), url: self.database.url.clone(), drain: false }]
        } else {
            self.databases.clone()
        }
    }

    /// This configuration for database `i` of [`Config::database_list`]
    /// alone (its `database.url`, no list): what a connection, the schema
    /// and the background threads of that database are opened with.
    pub fn for_database(&self, i: usize) -> Config {
        let mut c = self.clone();
        c.database.url = self.database_list()[i].url.clone();
        c.databases.clear();
        c
    }
}

/// Password checks: argon2 on threads of their own, never a worker's, each
/// with one block of memory for its hashes; failures throttled per
/// connection, per source address and per user name; a deadline to log in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Threads that check passwords (default 1). Each holds one argon2
    /// memory block (19 MiB with `mwmq user add`'s hashes).
    pub login_threads: usize,
    /// Logins that may wait for a check; more get `-TRYAGAIN` (default 64).
    pub login_queue: usize,
    /// Failed logins a source address may have in a row before its logins
    /// are refused unchecked (default 10).
    pub address_burst: u32,
    /// Failed logins per second a source address earns back (default 1).
    pub address_per_sec: f64,
    /// Failed logins for one user name, from any sources, before logins
    /// as that user are refused unchecked (default 20).
    pub user_burst: u32,
    /// Failed logins per second a user name earns back (default 1).
    pub user_per_sec: f64,
    /// Seconds a connection may take to log in before it is closed, where
    /// users are configured (default 30; 0: no limit).
    pub login_timeout_secs: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            login_threads: 1,
            login_queue: 64,
            address_burst: 10,
            address_per_sec: 1.0,
            user_burst: 20,
            user_per_sec: 1.0,
            login_timeout_secs: 30,
        }
    }
}

impl AuthConfig {
    /// The limits of failed logins, per source address and per user name.
    pub fn throttle(&self) -> mwserve::throttle::Limits {
        use mwserve::throttle::{Limits, Rate};
        Limits {
            source: Rate { burst: f64::from(self.address_burst.max(1)), per_sec: self.address_per_sec },
            user: Rate { burst: f64::from(self.user_burst.max(1)), per_sec: self.user_per_sec },
        }
    }
}

/// The listening side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address clients connect to (default `127.0.0.1:6380`).
    pub listen: String,
    /// How requests are carried out (default async): `async`, event loops
    /// that own their clients and pipelined database connections, or
    /// `pool`, the seed's net thread, request queue, workers and pool.
    pub engine: mwserve::config::Engine,
    /// Event loops of the async engine, 0 = half the cores, at least one (default 0).
    pub threads: usize,
    /// Database connections of each event loop (default 2): statements
    /// are pipelined on each, several in flight at once.
    pub loop_db: usize,
    /// Statements in flight at once on each of those connections
    /// (pipelined), at most (default 2). A loop fills its first connection
    /// before the next.
    pub loop_pipeline: usize,
    /// While a statement of one kind (`commands::Batch`: SENDs, ACKs, POPs
    /// or RECVs of one queue, XADDs, XACKs, XREADGROUPs of one stream) is in
    /// flight, the next of that kind waits for it, up to this
    /// long after the last statement started (default 2 ms; 0: never):
    /// what arrives meanwhile goes in one batch, and a slow statement does
    /// not hold the others back (docs/mwmq.md, Engines).
    pub loop_patience_us: u64,
    /// Worker threads; each carries one request at a time (default 8).
    pub workers: usize,
    /// Requests that may wait for a worker; when full, mwmq stops reading
    /// from clients until there is room (default 1024).
    pub queue_capacity: usize,
    /// Client connections served at once; further ones are told
    /// `-ERR max number of clients reached` and closed (default 10000).
    pub max_connections: usize,
    /// Largest argument (message body) in bytes; a longer one is read,
    /// discarded and refused (default 4 MiB).
    pub max_body: usize,
    /// Bytes of replies a client may leave unread before mwmq stops taking
    /// its next request (default 1 MiB).
    pub max_pending_output: usize,
    /// Most bytes of entries in one reply of a stream command (XRANGE,
    /// XREAD, XREADGROUP, XCLAIM, XAUTOCLAIM, XINFO STREAM FULL): the reply
    /// is cut between entries, as COUNT cuts it, and the database returns
    /// no more than that, so it bounds mwmq's memory per reader too (about
    /// three times this while a reply is built). An entry counts its fields'
    /// and values' bytes, 16 more for each and 64 for its id; the first
    /// always goes. At least `max_body` and each user's `max_body`, so one
    /// entry fits (default 16 MiB: four entries of the default `max_body`).
    pub max_reply_bytes: usize,
    /// Bytes of request arguments being read, all clients together; a client
    /// whose next argument does not fit waits until it does (default 256 MiB).
    pub input_budget: usize,
    /// Bytes of replies built and not yet written, all clients together
    /// (`output.rs`): a request whose reply may be large (RECV, POP, XRANGE,
    /// ...) reserves what it may return before its statement and waits,
    /// unread, until that fits; connections holding unwritten replies run
    /// nothing while it is used up. At least `max_reply_bytes` (default 256
    /// MiB: sixteen replies of the default `max_reply_bytes`).
    pub output_budget: usize,
    /// While requests wait for `output_budget`, a connection whose
    /// unwritten replies made no progress for this long is closed (its
    /// leases given back), as Redis closes a client past its output
    /// buffer's soft limit; 0: never (default 10000 ms).
    pub reply_stall_ms: u64,
    /// Most consumers one consumer group of a stream may have: an
    /// XREADGROUP, XCLAIM, XAUTOCLAIM or XGROUP CREATECONSUMER that would
    /// make one more is refused (`-OVERQUOTA`); 0: no limit, as Redis
    /// (default 1000).
    pub max_consumers_per_group: u64,
    /// Most requests carried out together (1: one at a time, the seed's
    /// architecture, which the lab's models assume and ask for). Above 1, a
    /// request of a kind that batches (`commands::Batch`: SEND without KEY,
    /// ACK, POP, RECV of one message without WAIT, XADD with `*`, XACK,
    /// XREADGROUP of new entries without BLOCK) takes up to `batch - 1` more
    /// of its kind waiting — in the pool engine's queue, or among an async
    /// loop's waiting requests — and they run as one statement: one round
    /// trip and one commit for all. Only what already waits is taken, so a
    /// lone request is not delayed (default 32).
    pub batch: usize,
    /// A request that waited this long for a worker is answered `-TRYAGAIN`
    /// without touching the database, 0 = never (default 10000 ms).
    pub queue_timeout_ms: u64,
    /// Listen beyond loopback although no `[[users]]` are configured, so
    /// that anyone who reaches the port can read and write every queue
    /// (default false: mwmq refuses to start so).
    pub insecure_no_auth: bool,
    /// Accept a configuration file holding secrets (users, a database
    /// password) that every user of the machine may read (default false: refused).
    pub allow_readable_secrets: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:6380".into(),
            engine: mwserve::config::Engine::Async,
            threads: 0,
            loop_db: 2,
            loop_pipeline: 2,
            loop_patience_us: 2000,
            workers: 8,
            queue_capacity: 1024,
            max_connections: 10_000,
            max_body: 4 << 20,
            max_pending_output: 1 << 20,
            max_reply_bytes: 16 << 20,
            input_budget: 256 << 20,
            output_budget: 256 << 20,
            reply_stall_ms: 10_000,
            max_consumers_per_group: 1000,
            batch: 32,
            queue_timeout_ms: 10_000,
            insecure_no_auth: false,
            allow_readable_secrets: false,
        }
    }
}

/// The database.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// A libpq connection string (`host=/run/postgresql dbname=mwmq user=mwmq`)
    /// or URL (`postgresql://user@host/db`). Required.
    pub url: String,
    /// Connections in the pool; a worker borrows one per request (default: the number of workers).
    pub pool: usize,
    /// Longest wait for a pooled connection before `-TRYAGAIN` (default 5000 ms).
    pub pool_wait_ms: u64,
    /// Connecting times out after this long (default 2000 ms).
    pub connect_timeout_ms: u64,
    /// The server cancels a statement running longer than this, 0 = never (default 10000 ms).
    pub statement_timeout_ms: u64,
    /// First wait before reconnecting after a failure, doubled per failure (default 100 ms).
    pub retry_min_ms: u64,
    /// Longest wait between reconnection attempts (default 2000 ms).
    pub retry_max_ms: u64,
    /// Tell other mwmq processes on the same database about new messages
    /// (LISTEN/NOTIFY), so their long polls wake at once (default true).
    pub notify: bool,
    /// New messages are announced at most this often per queue, in ms (default 2).
    pub notify_ms: u64,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: String::new(),
            pool: 0,
            pool_wait_ms: 5_000,
            connect_timeout_ms: 2_000,
            statement_timeout_ms: 10_000,
            retry_min_ms: 100,
            retry_max_ms: 2_000,
            notify: true,
            notify_ms: 2,
        }
    }
}

/// Queue behaviour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueuesConfig {
    /// Lease length when RECV gives no VT (default 30000 ms).
    pub default_vt_ms: u64,
    /// Longest RECV ... WAIT (default 300000 ms).
    pub max_wait_ms: u64,
    /// The shared poll of waiting requests (RECV WAIT, XREAD BLOCK) runs
    /// this often: one statement per database, whatever the number waiting
    /// (default 250 ms).
    pub poll_ms: u64,
    /// Notifications on mwmq's channel (other processes' new messages, or
    /// anyone's NOTIFY) are hints: the shared poll looks at the names they
    /// hinted at most this often, once for all that came meanwhile (default 10 ms).
    pub wake_ms: u64,
    /// Most queues or streams one waiting request may wait on (`XREAD ...
    /// BLOCK` over many keys); more is refused with `-ERR` (default 128).
    pub max_wait_names: usize,
    /// SEND ... KEY remembers keys this long (default 86400 s).
    pub dedup_window_s: u64,
    /// Dropped queues' messages and expired keys are removed this often (default 60 s).
    pub maintenance_s: u64,
    /// Acknowledged messages kept long enough (RETAIN) are deleted this often
    /// (default 1000 ms: small passes rather than a minute's worth at once).
    pub purge_ms: u64,
    /// The messages table is looked at this often and vacuumed when it holds
    /// `vacuum_min_dead` dead rows or more (default 10 s; 0: leave it to autovacuum).
    pub vacuum_s: u64,
    /// Dead rows that make the table worth a vacuum (default 10000).
    pub vacuum_min_dead: u64,
    /// QINFO's figures from the database are kept this long per queue, so
    /// that clients looping on QINFO cost one count per queue per period;
    /// 0 reads them for every QINFO (default 1000 ms).
    pub info_cache_ms: u64,
    /// Queues with series of their own on /metrics: names or patterns (`*`
    /// for any run of characters; default `["*"]`), at most
    /// `metrics_max_queues` of them; the others are added up as `queue="_other"`.
    pub metrics_queues: Vec<String>,
    /// Most queues with series of their own on /metrics (default 100).
    pub metrics_max_queues: usize,
    /// Queues whose series /metrics shows to anyone (patterns, default
    /// none); the other queues of `metrics_queues` only to a request that
    /// carries the admin token (`Authorization: Bearer`), and are otherwise
    /// added up as `queue="_other"`, so that /metrics names no queue that
    /// `/ui` would hide.
    pub public_queues: Vec<String>,
    /// The `/ui` page's rates: each queue's counters are sampled this often,
    /// and the last 60 periods kept (default 10000 ms: ten minutes).
    pub rates_sample_ms: u64,
    /// Schedules (QSCHEDULE) due are looked for at least this often, on each
    /// database (default 1000 ms; sooner when one is due sooner).
    pub schedule_ms: u64,
    /// A schedule's tick is sent while it is at most this old, whatever its
    /// CATCHUP; an older one was missed (every mwmq, or the database, down
    /// longer) and follows CATCHUP (default 60000 ms: a restart or a
    /// failover of the database loses no tick).
    pub schedule_grace_ms: u64,
}

impl Default for QueuesConfig {
    fn default() -> Self {
        QueuesConfig {
            default_vt_ms: 30_000,
            max_wait_ms: 300_000,
            poll_ms: 250,
            wake_ms: 10,
            max_wait_names: 128,
            dedup_window_s: 86_400,
            maintenance_s: 60,
            purge_ms: 1000,
            vacuum_s: 10,
            vacuum_min_dead: 10_000,
            info_cache_ms: 1000,
            metrics_queues: vec!["*".into()],
            metrics_max_queues: 100,
            public_queues: Vec::new(),
            rates_sample_ms: 10_000,
            schedule_ms: 1000,
            schedule_grace_ms: 60_000,
        }
    }
}

impl Config {
    /// Refuses a configuration without a database, which every other check
    /// accepts: `--print-config` shows one (the defaults, say) before it
    /// has a database; serving (`Cli::to_config`, [`crate::Mq`]'s start)
    /// and `mwmq rebalance` need one.
    pub fn require_database(&self) -> Result<(), ConfigError> {
        if self.databases.is_empty() && self.database.url.trim().is_empty() {
            return Err(ConfigError(
                "no database: give a PostgreSQL connection string with --db (e.g. 'host=/run/postgresql dbname=mwmq')"
                    .into(),
            ));
        }
        Ok(())
    }

    /// How long mwmq waits for a statement before it cuts the connection:
    /// the server's `statement_timeout_ms` and one second more for the
    /// server's own answer to arrive (none when statements never time out).
    pub fn statement_deadline(&self) -> Option<std::time::Duration> {
        let ms = self.database.statement_timeout_ms;
        (ms > 0).then(|| std::time::Duration::from_millis(ms + 1_000))
    }

    /// Event loops of the async engine: `threads`, or half the cores (at least one).
    pub fn loops(&self) -> usize {
        if self.server.threads > 0 {
            self.server.threads
        } else {
            (std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) / 2).max(1)
        }
    }

    /// Connections in the pool (0 in the file means one per worker).
    pub fn pool_size(&self) -> usize {
        if self.database.pool == 0 {
            self.server.workers
        } else {
            self.database.pool
        }
    }
}

impl ServiceConfig for Config {
    const INSTANCE: &'static str = "mq0";
    const SECTION: &'static str = "server";

    /// The database password (in the connection string) and the users'
    /// password hashes (see also [`Config::has_secrets`]).
    fn redact(&mut self) {
        self.database.url = mwstats::redact::redact(&self.database.url);
        for d in &mut self.databases {
            d.url = mwstats::redact::redact(&d.url);
        }
        for u in &mut self.users {
            u.password_hash = mwstats::redact::MASK.into();
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError(m));
        let s = &self.server;
        if s.batch == 0 || s.batch > 1024 {
            return err(format!("batch must be 1..=1024, not {}", s.batch));
        }
        if s.max_body == 0 || s.max_body > crate::resp::HARD_MAX_ARG {
            return err(format!("max_body must be 1..={} bytes, not {}", crate::resp::HARD_MAX_ARG, s.max_body));
        }
        if s.max_pending_output < 4096 {
            return err("max_pending_output must be at least 4096 bytes".into());
        }
        if s.input_budget < s.max_body {
            return err(format!("input_budget ({}) must be at least max_body ({})", s.input_budget, s.max_body));
        }
        let body = self.users.iter().filter_map(|u| u.max_body).fold(s.max_body, usize::max);
        if s.max_reply_bytes < body || s.max_reply_bytes > MAX_REPLY_BYTES {
            return err(format!(
                "max_reply_bytes ({}) must be at least the largest max_body ({body}: one entry must fit a reply) \
                 and at most {MAX_REPLY_BYTES}",
                s.max_reply_bytes
            ));
        }
        if s.output_budget < s.max_reply_bytes {
            return err(format!(
                "output_budget ({}) must be at least max_reply_bytes ({}): a whole reply must fit",
                s.output_budget, s.max_reply_bytes
            ));
        }
        let d = &self.database;
        if !self.databases.is_empty() && !d.url.trim().is_empty() {
            return err("give either one database (--db, database.url) or a [[databases]] list, not both".into());
        }
        if self.databases.len() > MAX_DATABASES {
            return err(format!("at most {MAX_DATABASES} [[databases]], not {}", self.databases.len()));
        }
        if self.database_list().iter().all(|d| d.drain) {
            return err("[[databases]]: every database has drain = true: at least one must take queues".into());
        }
        let mut names = std::collections::BTreeSet::new();
        for e in &self.database_list() {
            if e.name.trim().is_empty() || !names.insert(e.name.as_str()) {
                return err(format!("[[databases]]: each needs a name of its own ({:?} is empty or repeated)", e.name));
            }
            if e.url.trim().is_empty() {
                if self.databases.is_empty() {
                    // (No database at all: `require_database` says so.)
                    continue;
                }
                return err(format!("[[databases]] {:?}: no url (a PostgreSQL connection string)", e.name));
            }
            let target = crate::db::tls::split(&e.url).map_err(ConfigError)?;
            if let Err(err_) = target.conninfo.parse::<postgres::Config>() {
                return err(format!("database connection string {:?}: {err_}", mwstats::redact::redact(&e.url)));
            }
        }
        if self.pool_size() > 1024 {
            return err(format!("the pool must have 1..=1024 connections, not {}", self.pool_size()));
        }
        if d.pool_wait_ms == 0 || d.connect_timeout_ms == 0 {
            return err("pool_wait_ms and connect_timeout_ms must be positive".into());
        }
        if d.retry_min_ms == 0 || d.retry_max_ms < d.retry_min_ms {
            return err("retry_min_ms must be positive and at most retry_max_ms".into());
        }
        let q = &self.queues;
        if q.default_vt_ms == 0 || q.default_vt_ms > crate::command::MAX_DELAY_MS {
            return err(format!("default_vt_ms must be 1..={}", crate::command::MAX_DELAY_MS));
        }
        if q.poll_ms == 0 || q.maintenance_s == 0 || q.purge_ms == 0 || q.rates_sample_ms == 0 {
            return err("poll_ms, maintenance_s, purge_ms and rates_sample_ms must be positive".into());
        }
        if q.schedule_ms == 0 || q.schedule_grace_ms == 0 {
            return err("schedule_ms and schedule_grace_ms must be positive".into());
        }
        if q.wake_ms == 0 || q.max_wait_names == 0 {
            return err("wake_ms and max_wait_names must be positive".into());
        }
        crate::users::Users::from_config(&self.users).map_err(ConfigError)?;
        if self.auth.login_threads == 0 || self.auth.login_queue == 0 {
            return Err(ConfigError("auth: login_threads and login_queue must be at least 1".into()));
        }
        self.tls.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Config {
        let mut c = Config::default();
        c.database.url = "host=/tmp dbname=mwmq".into();
        c
    }

    #[test]
    fn defaults_need_only_a_database() {
        // (Valid to print; not to serve.)
        Config::default().validate().unwrap();
        assert!(Config::default().require_database().unwrap_err().0.contains("--db"));
        ok().validate().unwrap();
        ok().require_database().unwrap();
        assert_eq!(ok().pool_size(), 8);
    }

    #[test]
    fn toml_round_trip_and_unknown_keys() {
        let c = ok();
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
        let e = Config::from_toml("[server]\nworkerz = 3\n").unwrap_err();
        assert!(e.0.contains("unknown field `workerz`"), "{e}");
    }

    #[test]
    fn several_databases() {
        let c = Config {
            databases: vec![
                DatabaseEntry { name: "a".into(), url: "host=/tmp/a dbname=mwmq".into(), drain: false },
                DatabaseEntry { name: "b".into(), url: "host=/tmp/b password=secret dbname=mwmq".into(), drain: false },
            ],
            ..Config::default()
        };
        c.validate().unwrap();
        assert_eq!(c.database_list().len(), 2);
        assert_eq!(c.for_database(1).database.url, "host=/tmp/b password=secret dbname=mwmq");
        assert!(c.for_database(1).databases.is_empty());
        assert!(c.has_secrets());
        let shown = c.redacted().to_toml();
        assert!(!shown.contains("password=secret"), "{shown}");
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
        let mut both = c.clone();
        both.database.url = "host=/tmp".into();
        assert!(both.validate().unwrap_err().0.contains("not both"));
        let mut twice = c.clone();
        twice.databases[1].name = "a".into();
        assert!(twice.validate().unwrap_err().0.contains("name of its own"));
        assert_eq!(ok().database_list()[0].name, "main");
        let mut drained = c.clone();
        drained.databases.iter_mut().for_each(|d| d.drain = true);
        assert!(drained.validate().unwrap_err().0.contains("drain"));
    }

    #[test]
    fn refusals() {
        let mut c = ok();
        c.server.workers = 0;
        assert!(c.validate().unwrap_err().0.contains("workers"));
        let mut c = ok();
        c.database.url = "host=/tmp port=notaport".into();
        assert!(c.validate().unwrap_err().0.contains("connection string"));
        let mut c = ok();
        c.server.input_budget = 10;
        assert!(c.validate().unwrap_err().0.contains("input_budget"));
        let mut c = ok();
        c.server.max_reply_bytes = c.server.max_body - 1;
        assert!(c.validate().unwrap_err().0.contains("max_reply_bytes"));
        let mut c = ok();
        c.server.output_budget = c.server.max_reply_bytes - 1;
        assert!(c.validate().unwrap_err().0.contains("output_budget"));
        let mut c = ok();
        c.server.max_reply_bytes = 0;
        assert!(c.validate().unwrap_err().0.contains("one entry must fit"));
        let mut c = ok();
        c.server.max_reply_bytes = MAX_REPLY_BYTES + 1;
        assert!(c.validate().unwrap_err().0.contains("at most"));
        let mut c = ok();
        c.users = vec![crate::users::UserConfig {
            name: "big".into(),
            password_hash: crate::users::hash_password(b"pw"),
            max_body: Some(32 << 20),
            ..Default::default()
        }];
        assert!(c.validate().unwrap_err().0.contains("max_reply_bytes"), "a user's max_body counts too");
        c.server.max_reply_bytes = 32 << 20;
        c.validate().unwrap();
    }
}
