//! mwproxy's configuration: one struct per section, documented defaults, a
//! `validate()` that explains every refusal, and TOML loading that rejects
//! unknown keys. Command-line flags (see `cli.rs`) override the file.

use std::collections::BTreeMap;
use std::net::ToSocketAddrs;

use mwserve::stream::Addr;

use serde::{Deserialize, Serialize};

pub use mwserve::config::{ConfigError, ServiceConfig, StatsConfig, TlsConfig};

/// Everything mwproxy needs to run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where clients connect and how many threads serve them.
    pub proxy: ProxyConfig,
    /// Which servers hold which keys (without a `[route]`: every key).
    pub routing: RoutingConfig,
    /// Named pools that a `[route]` sends requests to (`routes/spec.rs`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub pools: BTreeMap<String, RoutingConfig>,
    /// The route tree over `pools`; without one, `[routing]` is the only pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<crate::routes::spec::RouteSpec>,
    /// How mwproxy talks to the servers.
    pub backend: BackendConfig,
    /// Protocol limits.
    pub limits: LimitsConfig,
    /// TLS on the clients' side.
    pub tls: TlsConfig,
    /// Who may use the proxy.
    pub auth: AuthConfig,
    /// Measurement outputs.
    pub stats: StatsConfig,
}

/// Client authentication as memcached's `-Y` does it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// A file of `user:password` lines; a client must log in (`set <key> 0 0
    /// <n>` with `<user> <password>` as data) before anything else (default:
    /// everyone is let in).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Failed logins after which a connection is closed (default 3).
    pub max_failures: u32,
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
    /// Accept users files (`file`, `[backend] auth_file`) that every user
    /// of the machine may read (default false: refused).
    pub allow_readable_secrets: bool,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            file: None,
            max_failures: 3,
            address_burst: 10,
            address_per_sec: 1.0,
            user_burst: 20,
            user_per_sec: 1.0,
            login_timeout_secs: 30,
            allow_readable_secrets: false,
        }
    }
}

impl AuthConfig {
    /// The limits of failed logins, per source and per user name.
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
pub struct ProxyConfig {
    /// Address clients connect to (default `127.0.0.1:11311`).
    pub listen: String,
    /// How requests are carried out: `async` (one event loop per thread,
    /// pipelined server connections) or `pool` (net threads, a queue,
    /// workers; the seed reports' architecture) (default async).
    pub engine: Engine,
    /// Event loops of the async engine; 0 means half the cores available to
    /// the process, at least one (default 0; see docs/mwproxy.md for why).
    pub threads: usize,
    /// Worker threads of the pool engine; each owns one connection to every
    /// server (default 8).
    pub workers: usize,
    /// Threads of the pool engine that accept, read and parse client requests (default 1).
    pub net_threads: usize,
    /// Requests that may wait for a worker; when full, mwproxy stops reading
    /// from clients until there is room again (default 1024).
    pub queue_capacity: usize,
    /// Client connections served at once; further ones are told
    /// `SERVER_ERROR Too many open connections` and closed (default 4096).
    pub max_connections: usize,
    /// Bytes of replies a client may leave unread before mwproxy stops
    /// running and reading its requests (default 1 MiB).
    pub max_pending_output: usize,
    /// Bytes of a client's requests that may wait for a worker before
    /// mwproxy stops reading it (default 1 MiB).
    pub max_pending_input: usize,
    /// Bytes of waiting requests, and of unread replies, of all clients
    /// together; beyond it only clients that hold none are read and served
    /// (default 256 MiB).
    pub memory_budget: usize,
    /// Seconds to let in-flight requests finish after SIGTERM/SIGINT (default 5).
    pub shutdown_grace_secs: u64,
    /// Connections the kernel may hold for mwproxy to accept (`listen(2)`'s
    /// backlog, capped by `net.core.somaxconn`) (default 1024).
    pub backlog: u32,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: "127.0.0.1:11311".into(),
            engine: Engine::Async,
            threads: 0,
            workers: 8,
            net_threads: 1,
            queue_capacity: 1024,
            max_connections: 4096,
            max_pending_output: 1 << 20,
            max_pending_input: 1 << 20,
            memory_budget: 256 << 20,
            shutdown_grace_secs: 5,
            backlog: 1024,
        }
    }
}

impl ProxyConfig {
    /// Event loops of the async engine: `threads`, or half the cores
    /// available (at least one): the kernel's share of the work — two
    /// syscalls per request and the wake-ups, most of the time spent — runs
    /// on the same cores, and on this 2-core machine one loop measured as
    /// fast as two or faster (docs/mwproxy.md).
    pub fn loops(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            (std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) / 2).max(1)
        }
    }

    /// Threads that carry requests to the servers, each with its own
    /// connection to every server: the workers of the pool engine, the
    /// loops of the async engine.
    pub fn carriers(&self) -> usize {
        match self.engine {
            Engine::Pool => self.workers,
            Engine::Async => self.loops(),
        }
    }
}

/// Key placement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// memcached servers as `host:port[:weight]`, in ring order.
    #[serde(with = "server_list")]
    pub servers: Vec<ServerSpec>,
    /// How keys map to servers (default ketama).
    pub hash: HashKind,
    /// The function that hashes a key (twemproxy's `hash`; default md5).
    #[serde(with = "key_hash_name")]
    pub key_hash: KeyHash,
    /// Two characters: only the part of a key between them is hashed, so
    /// keys that share it share a server (twemproxy's `hash_tag`; default none).
    pub hash_tag: String,
    /// Copies of every key, 1..=number of servers (default 1).
    pub replication: usize,
    /// Which replica serves a read (default round-robin).
    pub read_policy: ReadPolicy,
    /// With replication = number of servers, whether a multi-get is split
    /// over all servers or sent whole to one (default sharded).
    pub multiget: MultigetMode,
    /// What a multi-get returns when some servers fail (default partial).
    pub multiget_failure: MultigetFailure,
    /// Replicas that must confirm a write before it is acknowledged;
    /// 0 means all of them (default 0).
    pub write_quorum: usize,
    /// Look a key up on the next replica when one does not have it (a
    /// replica that came back empty), instead of answering a miss (default false).
    pub miss_failover: bool,
}

impl RoutingConfig {
    /// How the ring places keys.
    pub fn placement(&self) -> Placement {
        let tag = <[u8; 2]>::try_from(self.hash_tag.as_bytes()).ok();
        Placement { distribution: self.hash.ring_kind(), hash: self.key_hash, tag }
    }

    /// Replicas that must confirm a write.
    pub fn quorum(&self) -> usize {
        if self.write_quorum == 0 {
            self.replication
        } else {
            self.write_quorum
        }
    }
}

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig {
            servers: Vec::new(),
            hash: HashKind::Ketama,
            key_hash: KeyHash::Md5,
            hash_tag: String::new(),
            replication: 1,
            read_policy: ReadPolicy::RoundRobin,
            multiget: MultigetMode::Sharded,
            multiget_failure: MultigetFailure::Partial,
            write_quorum: 0,
            miss_failover: false,
        }
    }
}

/// Backend connections.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackendConfig {
    /// Milliseconds to wait for a connection to a server (default 500).
    pub connect_timeout_ms: u64,
    /// Milliseconds to wait for a server's reply before answering
    /// `SERVER_ERROR` (default 1000).
    pub timeout_ms: u64,
    /// First wait before reconnecting to a failed server, doubled after each
    /// failure (default 100).
    pub retry_min_ms: u64,
    /// Longest wait between reconnection attempts (default 2000).
    pub retry_max_ms: u64,
    /// A server that answers nothing for this long while requests wait for
    /// it, as other servers answer, is stalled: one request waits for it up
    /// to the timeout, the others give up at once; 0 = every request waits
    /// for the timeout (default 50).
    pub stall_ms: u64,
    /// Speak TLS to the servers (memcached started with `-Z`) (default false).
    pub tls: bool,
    /// PEM CA certificates that signed the servers' certificates (required with `tls`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<String>,
    /// The name the servers' certificates carry (default: each server's host).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
    /// A `user:password` file whose first line logs in to servers started
    /// with `-Y` (default: no login).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_file: Option<String>,
    /// Take a server that failed `eject_after` times in a row off the ring
    /// for `eject_for_ms`, its keys going where the ring without it puts
    /// them (twemproxy's `auto_eject_hosts`); off, a failed server's keys
    /// fail over to their replicas or get an error (default false).
    pub eject: bool,
    /// Failures in a row that eject a server (twemproxy's `server_failure_limit`, default 2).
    pub eject_after: u32,
    /// Milliseconds an ejected server stays off the ring (twemproxy's `server_retry_timeout`, default 30000).
    pub eject_for_ms: u64,
    /// Active health check (`checker.rs`): every server is asked `version`
    /// at start, then again when no request has reached it for this long,
    /// and a server that is down when its backoff ends; 0 = off, a server's
    /// health is then what requests find (default 1000).
    pub check_ms: u64,
}

impl BackendConfig {
    /// How long a carrier waits on a quiet server before it checks whether
    /// the server stalled: half of `stall_ms` (at least 5 ms), or the whole
    /// timeout when stall detection is off.
    pub fn stall_slice(&self) -> std::time::Duration {
        let ms = if self.stall_ms > 0 { (self.stall_ms / 2).max(5) } else { self.timeout_ms };
        std::time::Duration::from_millis(ms)
    }
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            connect_timeout_ms: 500,
            timeout_ms: 1000,
            retry_min_ms: 100,
            retry_max_ms: 2000,
            stall_ms: 50,
            tls: false,
            tls_ca: None,
            tls_server_name: None,
            auth_file: None,
            eject: false,
            eject_after: 2,
            eject_for_ms: 30_000,
            check_ms: 1000,
        }
    }
}

/// Protocol limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest value accepted, in bytes (default 1 MiB, memcached's `-I`).
    pub max_value_size: usize,
    /// Longest multi-get command line, in bytes (default 1 MiB).
    pub max_get_line: usize,
    /// Largest reply to one retrieval; a larger one is answered
    /// `SERVER_ERROR out of memory writing get response` (default 32 MiB).
    pub max_reply_size: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig { max_value_size: 1 << 20, max_get_line: 1 << 20, max_reply_size: 32 << 20 }
    }
}

/// Key-to-server mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum HashKind {
    /// libmemcached/twemproxy-compatible ketama consistent hashing.
    Ketama,
    /// The key's hash modulo the servers' total weight.
    Modula,
    /// A random server for every request (twemproxy's `distribution: random`).
    Random,
}

pub use mwserve::config::Engine;

/// Which replica answers a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ReadPolicy {
    /// Rotate over the key's replicas.
    RoundRobin,
    /// Always the first replica on the ring; the others only on failure.
    Primary,
}

/// Multi-get handling when every server holds every key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum MultigetMode {
    /// Split the keys evenly over all servers.
    Sharded,
    /// Send the whole multi-get to one server (round-robin).
    NonSharded,
}

/// Multi-get answer when a server fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum MultigetFailure {
    /// Return the hits of the servers that answered.
    Partial,
    /// Answer `SERVER_ERROR` for the whole request.
    Fail,
}

pub use mcproto::ring::{KeyHash, Placement, ServerSpec};

/// A key hash is written by its name (`fnv1a_64`) in the TOML file.
mod key_hash_name {
    use super::KeyHash;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &KeyHash, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<KeyHash, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// Servers are written as `host:port:weight` strings in the TOML file.
mod server_list {
    use super::ServerSpec;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[ServerSpec], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|x| x.to_string()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ServerSpec>, D::Error> {
        Vec::<String>::deserialize(d)?.iter().map(|s| s.parse().map_err(serde::de::Error::custom)).collect()
    }
}

/// Resolves a server's address (first result); a unix socket is its path.
pub fn resolve(s: &ServerSpec) -> Result<Addr, ConfigError> {
    if s.is_unix() {
        return Ok(Addr::Unix(s.host.clone().into()));
    }
    (s.host.as_str(), s.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(Addr::Tcp)
        .ok_or_else(|| ConfigError(format!("cannot resolve server {}", s.endpoint())))
}

impl HashKind {
    /// The ring's own name for this mapping.
    pub fn ring_kind(self) -> mcproto::ring::HashKind {
        match self {
            HashKind::Ketama => mcproto::ring::HashKind::Ketama,
            HashKind::Modula => mcproto::ring::HashKind::Modula,
            HashKind::Random => mcproto::ring::HashKind::Random,
        }
    }
}

impl ServiceConfig for Config {
    const INSTANCE: &'static str = "mw0";
    const SECTION: &'static str = "proxy";

    fn check(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError(m));
        let p = &self.proxy;
        if p.net_threads == 0 || p.net_threads > 64 {
            return err(format!("net_threads must be 1..=64, not {}", p.net_threads));
        }
        if p.threads > 256 {
            return err(format!("threads must be 0 (half the cores) ..=256, not {}", p.threads));
        }
        if p.max_pending_output < 4096 || p.max_pending_input < 4096 {
            return err("max_pending_output and max_pending_input must be at least 4096 bytes".into());
        }
        if p.memory_budget < p.max_pending_output.max(p.max_pending_input) {
            return err(format!(
                "memory_budget ({}) must be at least max_pending_output and max_pending_input",
                p.memory_budget
            ));
        }
        if self.route_tree()?.is_none() {
            if self.routing.servers.is_empty() {
                return err("no servers: give at least one with --servers host:port (or -m)".into());
            }
            check_pool(&self.routing)?;
        }
        let b = &self.backend;
        if b.eject && (b.eject_after == 0 || b.eject_for_ms == 0) {
            return err("eject_after and eject_for_ms must be at least 1".into());
        }
        if p.backlog == 0 || p.backlog > i32::MAX as u32 {
            return err(format!("backlog must be 1..={}, not {}", i32::MAX, p.backlog));
        }
        if b.connect_timeout_ms == 0 || b.timeout_ms == 0 {
            return err("backend timeouts must be at least 1 ms".into());
        }
        if b.retry_min_ms == 0 || b.retry_max_ms < b.retry_min_ms {
            return err("backend retry_min_ms must be >= 1 and retry_max_ms >= retry_min_ms".into());
        }
        if b.check_ms > 0 && b.check_ms < 10 {
            return err(format!("backend check_ms must be 0 (no health checks) or at least 10, not {}", b.check_ms));
        }
        if b.stall_ms >= b.timeout_ms {
            return err(format!(
                "backend stall_ms ({}) must be below timeout_ms ({}), or 0 to turn stall detection off",
                b.stall_ms, b.timeout_ms
            ));
        }
        let l = &self.limits;
        if l.max_value_size == 0 || l.max_value_size > (1 << 30) {
            return err(format!("max_value_size must be 1..=1073741824 bytes, not {}", l.max_value_size));
        }
        if l.max_get_line < 2048 {
            return err("max_get_line must be at least 2048 bytes".into());
        }
        if l.max_reply_size < l.max_value_size {
            return err(format!(
                "max_reply_size ({}) must be at least max_value_size ({})",
                l.max_reply_size, l.max_value_size
            ));
        }
        self.tls.validate()?;
        if b.tls && b.tls_ca.is_none() {
            return err(
                "backend tls needs tls_ca (--server-tls-ca): the CA that signed the servers' certificates".into()
            );
        }
        if !b.tls && (b.tls_ca.is_some() || b.tls_server_name.is_some()) {
            return err("backend tls_ca and tls_server_name need tls (--server-tls)".into());
        }
        Ok(())
    }
}

/// Checks one pool's placement (`[routing]`, or a `[pools.<name>]`).
pub fn check_pool(r: &RoutingConfig) -> Result<(), ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    if r.servers.is_empty() {
        return err("no servers".into());
    }
    if r.replication == 0 || r.replication > r.servers.len() {
        return err(format!(
            "replication must be 1..={} (the number of servers), not {}",
            r.servers.len(),
            r.replication
        ));
    }
    if r.write_quorum > r.replication {
        return err(format!(
            "write_quorum must be 0 (all replicas) or 1..={} (the replication), not {}",
            r.replication, r.write_quorum
        ));
    }
    if !r.hash_tag.is_empty() && r.hash_tag.len() != 2 {
        return err(format!(
            "hash_tag is two characters, the opening and the closing one (\"{{}}\"), not {:?}",
            r.hash_tag
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for s in &r.servers {
        if !seen.insert(s.endpoint()) {
            return err(format!("server {} is listed twice", s.endpoint()));
        }
    }
    Ok(())
}

/// The placement settings of `r` that differ from their defaults (by
/// their names in `[routing]`): beside a `[route]` they would place nothing.
fn placement_settings(r: &RoutingConfig) -> Vec<&'static str> {
    let d = RoutingConfig::default();
    let differ = [
        ("hash", r.hash != d.hash),
        ("key_hash", r.key_hash != d.key_hash),
        ("hash_tag", r.hash_tag != d.hash_tag),
        ("replication", r.replication != d.replication),
        ("read_policy", r.read_policy != d.read_policy),
        ("multiget", r.multiget != d.multiget),
        ("multiget_failure", r.multiget_failure != d.multiget_failure),
        ("write_quorum", r.write_quorum != d.write_quorum),
        ("miss_failover", r.miss_failover != d.miss_failover),
    ];
    differ.into_iter().filter(|d| d.1).map(|d| d.0).collect()
}

impl Config {
    /// Whether requests go through a route tree (`[pools]` and `[route]`).
    pub fn has_routes(&self) -> bool {
        self.route.is_some()
    }

    /// The `[routing]` that keyless requests go by (`flush_all`, `stats`,
    /// `version` go to every server): `[routing]` itself, or with a route
    /// tree the servers of every pool, each once, in pool order.
    pub fn effective_routing(&self) -> std::borrow::Cow<'_, RoutingConfig> {
        if !self.has_routes() {
            return std::borrow::Cow::Borrowed(&self.routing);
        }
        let mut r = RoutingConfig { replication: 1, servers: Vec::new(), ..self.routing.clone() };
        for s in self.pools.values().flat_map(|p| &p.servers) {
            if !r.servers.iter().any(|o| o.endpoint() == s.endpoint()) {
                r.servers.push(s.clone());
            }
        }
        std::borrow::Cow::Owned(r)
    }

    /// The route tree, read and checked (`None` without one).
    pub fn route_tree(&self) -> Result<Option<crate::routes::spec::Tree>, ConfigError> {
        let Some(spec) = &self.route else {
            if !self.pools.is_empty() {
                return Err(ConfigError("[pools] are used by a [route]: give one (docs/mwproxy.md, Routes)".into()));
            }
            return Ok(None);
        };
        if !self.routing.servers.is_empty() {
            return Err(ConfigError(
                "with a [route], servers belong to its [pools.<name>]: leave [routing] servers (--servers) out".into(),
            ));
        }
        if self.pools.is_empty() {
            return Err(ConfigError("[route] needs [pools.<name>] with their servers".into()));
        }
        let stray = placement_settings(&self.routing);
        if !stray.is_empty() {
            return Err(ConfigError(format!(
                "with a [route], each pool places its own keys: [routing] {} (from the file or a flag) would \
                 apply to no pool; set it in the [pools.<name>] it is meant for",
                stray.join(", ")
            )));
        }
        for (name, pool) in &self.pools {
            check_pool(pool).map_err(|e| ConfigError(format!("pool {name}: {}", e.0)))?;
        }
        let names: Vec<String> = self.pools.keys().cloned().collect();
        crate::routes::spec::read(&spec.value, &names).map(Some)
    }

    /// The parser limits these settings imply.
    pub fn parser_limits(&self) -> mcproto::Limits {
        mcproto::Limits {
            max_value_len: self.limits.max_value_size,
            max_get_line_len: self.limits.max_get_line,
            ..mcproto::Limits::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_servers(n: usize) -> Config {
        let mut c = Config::default();
        c.routing.servers = (0..n).map(|i| format!("127.0.0.1:{}", 11211 + i).parse().unwrap()).collect();
        c
    }

    #[test]
    fn toml_round_trip_and_unknown_keys() {
        let c = with_servers(3);
        let back = Config::from_toml(&c.to_toml()).unwrap();
        assert_eq!(back, c);
        let e = Config::from_toml("[proxy]\nworkerz = 3\n").unwrap_err();
        assert!(e.0.contains("workerz"), "{e}");
        let e = Config::from_toml("bogus = 1\n").unwrap_err();
        assert!(e.0.contains("bogus"), "{e}");
        let c = Config::from_toml("[routing]\nservers = [\"a:1:2\"]\nread_policy = \"primary\"\n").unwrap();
        assert_eq!(c.routing.read_policy, ReadPolicy::Primary);
        assert_eq!(c.routing.servers[0].weight, 2);
    }

    #[test]
    fn validation_explains() {
        assert!(with_servers(3).validate().is_ok());
        assert!(Config::default().validate().unwrap_err().0.contains("no servers"));
        let mut c = with_servers(2);
        c.routing.replication = 3;
        assert!(c.validate().unwrap_err().0.contains("replication"));
        let mut c = with_servers(2);
        c.proxy.workers = 0;
        assert!(c.validate().unwrap_err().0.contains("workers"));
        let mut c = with_servers(1);
        c.routing.servers.push(c.routing.servers[0].clone());
        assert!(c.validate().unwrap_err().0.contains("twice"));
        let mut c = with_servers(1);
        c.backend.check_ms = 5;
        assert!(c.validate().unwrap_err().0.contains("check_ms"));
        c.backend.check_ms = 0;
        assert!(c.validate().is_ok(), "0 turns the health checks off");
        let mut c = with_servers(1);
        c.proxy.listen = "nonsense".into();
        assert!(c.validate().unwrap_err().0.contains("listen"));
    }

    #[test]
    fn placement_settings_beside_a_route_are_refused_by_name() {
        let text = "route = \"p\"\n[pools.p]\nservers = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n";
        let mut c = Config::from_toml(text).unwrap();
        assert!(c.validate().is_ok());
        // (`--replication 2 --read-policy primary` beside a route: nothing replicated.)
        c.routing.replication = 2;
        c.routing.read_policy = ReadPolicy::Primary;
        let e = c.validate().unwrap_err().0;
        assert!(e.contains("[routing] replication, read_policy") && e.contains("[pools.<name>]"), "{e}");
        let pooled = text.replace("servers = [", "replication = 2\nservers = [");
        assert!(Config::from_toml(&pooled).unwrap().validate().is_ok(), "in the pool, it replicates");
    }
}
