//! mwload's command line and the validated run configuration.
//!
//! The common flags are spelled as memtier_benchmark spells them (`-s -p -t -c
//! -n --ratio --test-time --key-prefix --key-minimum --key-maximum
//! --key-pattern -d --data-size-range --data-size-list --multi-key-get
//! --expiry-range --pipeline -P --hide-histogram`) so a seed script can swap the
//! binary; the rest is mwload's own.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use clap::Parser;
use mcproto::ring::ServerSpec;

use crate::secure::Secure;
use crate::workload::{KeyPattern, ValueSizes, Workload};

/// mwload: a memcached load generator (closed and open loop) that measures right.
#[derive(Parser, Debug, Clone)]
#[command(name = "mwload", version, about, long_about = None, after_long_help = AFTER_HELP)]
pub struct Args {
    /// Server host (with -p); see --servers for several.
    #[arg(short = 's', long = "server", value_name = "HOST", default_value = "127.0.0.1", help_heading = SERVERS)]
    pub server: String,
    /// Server port (memcached itself listens on 11211) [default: 11311, mwproxy's; 6380 with -P mq, mwmq's].
    #[arg(short = 'p', long, value_name = "PORT", help_heading = SERVERS)]
    pub port: Option<u16>,
    /// Several targets, host:port[:weight] comma-separated; keys are placed with ketama.
    #[arg(long, value_delimiter = ',', value_name = "LIST", help_heading = SERVERS)]
    pub servers: Vec<ServerSpec>,
    /// Protocol: memcache_text (memtier's -P), or mq for mwmq (RESP): sets
    /// become SENDs, gets become receives (--receive), -d is the body size.
    #[arg(short = 'P', long, value_name = "PROTOCOL", default_value = "memcache_text", help_heading = SERVERS)]
    pub protocol: String,
    /// Speak TLS to the targets (memcached -Z, mwproxy --tls-cert, mwmq with TLS); needs --tls-ca.
    #[arg(long, help_heading = SERVERS)]
    pub tls: bool,
    /// PEM CA certificates that signed the targets' certificates.
    #[arg(long, value_name = "FILE", help_heading = SERVERS)]
    pub tls_ca: Option<PathBuf>,
    /// The name the targets' certificates carry [default: each target's IP address].
    #[arg(long, value_name = "NAME", help_heading = SERVERS)]
    pub tls_server_name: Option<String>,
    /// Log in first on every connection, as memcached -Y and mwproxy --auth-file expect.
    #[arg(long, value_name = "USER:PASSWORD", help_heading = SERVERS)]
    pub auth: Option<String>,
    /// Reconnect a lost connection (after 50 ms, doubling to 1 s between
    /// attempts; giving up after 10 s of failures) instead of stopping its load.
    #[arg(long, help_heading = SERVERS)]
    pub reconnect: bool,
    /// Load threads.
    #[arg(short = 't', long, value_name = "N", default_value_t = 2, help_heading = LOAD)]
    pub threads: usize,
    /// Connections (clients) per thread.
    #[arg(short = 'c', long = "clients", value_name = "N", default_value_t = 10, help_heading = LOAD)]
    pub clients: usize,
    /// Virtual clients per connection, each with one request outstanding
    /// (closed loop); `--pipeline` is memtier's name for the same.
    #[arg(long, visible_alias = "pipeline", value_name = "N", default_value_t = 1, help_heading = LOAD)]
    pub virtual_clients: usize,
    /// Seconds of measurement, unless -n is given [default: 10].
    #[arg(long = "test-time", value_name = "SECS", help_heading = LOAD)]
    pub test_time: Option<f64>,
    /// Requests per virtual client instead of a duration (closed loop).
    #[arg(short = 'n', long = "requests", value_name = "N", help_heading = LOAD)]
    pub requests: Option<u64>,
    /// Seconds of load before the measurement (windows marked `warmup`).
    #[arg(long, default_value_t = 0.0, value_name = "SECS", help_heading = LOAD)]
    pub warmup: f64,
    /// Seconds of load after the measurement (windows marked `cooldown`).
    #[arg(long, default_value_t = 0.0, value_name = "SECS", help_heading = LOAD)]
    pub cooldown: f64,
    /// Think time between a reply and the next request, in microseconds (closed loop).
    #[arg(long, value_name = "US", default_value_t = 0, help_heading = LOAD)]
    pub think_time: u64,
    /// Think times: fixed or exponential.
    #[arg(long, value_name = "DIST", default_value = "fixed", help_heading = LOAD)]
    pub think_dist: String,
    /// Open loop: total requests per second (Poisson arrivals unless --arrival fixed).
    #[arg(long, value_name = "PER_SEC", help_heading = LOAD)]
    pub rate: Option<f64>,
    /// Arrivals of the open loop: poisson or fixed.
    #[arg(long, value_name = "ARRIVAL", default_value = "poisson", help_heading = LOAD)]
    pub arrival: String,
    /// Exit with status 3 when more than this share of requests fail.
    #[arg(long, value_name = "SHARE", default_value_t = 0.01, help_heading = LOAD)]
    pub max_error_rate: f64,
    /// Sets to gets, as SETS:GETS.
    #[arg(long, value_name = "SETS:GETS", default_value = "1:10", help_heading = WORKLOAD)]
    pub ratio: String,
    /// Share of all requests that are deletes (0..1).
    #[arg(long, value_name = "SHARE", default_value_t = 0.0, help_heading = WORKLOAD)]
    pub delete_share: f64,
    /// Key prefix.
    #[arg(long, value_name = "PREFIX", default_value = "key:", help_heading = WORKLOAD)]
    pub key_prefix: String,
    /// Keys are zero-padded to this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 16, help_heading = WORKLOAD)]
    pub key_size: usize,
    /// Smallest key number.
    #[arg(long = "key-minimum", value_name = "N", default_value_t = 0, help_heading = WORKLOAD)]
    pub key_minimum: u64,
    /// Largest key number.
    #[arg(long = "key-maximum", value_name = "N", default_value_t = 9999, help_heading = WORKLOAD)]
    pub key_maximum: u64,
    /// Which keys: uniform, sequential, gaussian or zipf (memtier's R, S, G, Z and SET:GET forms too).
    #[arg(long = "key-pattern", value_name = "PATTERN", default_value = "uniform", help_heading = WORKLOAD)]
    pub key_pattern: String,
    /// Gaussian spread as a fraction of the key space [default: 1/6].
    #[arg(long, value_name = "FRACTION", default_value_t = 1.0 / 6.0, hide_default_value = true, help_heading = WORKLOAD)]
    pub key_stddev: f64,
    /// Gaussian centre as a fraction of the key space.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.5, help_heading = WORKLOAD)]
    pub key_median: f64,
    /// Zipf exponent.
    #[arg(long, value_name = "EXP", default_value_t = 1.0, help_heading = WORKLOAD)]
    pub key_zipf_exp: f64,
    /// Value size in bytes.
    #[arg(short = 'd', long = "data-size", value_name = "BYTES", default_value_t = 128, help_heading = WORKLOAD)]
    pub data_size: usize,
    /// Uniform value sizes MIN-MAX (overrides -d).
    #[arg(long = "data-size-range", value_name = "MIN-MAX", help_heading = WORKLOAD)]
    pub data_size_range: Option<String>,
    /// Weighted value sizes SIZE:WEIGHT,... (overrides -d).
    #[arg(long = "data-size-list", value_name = "LIST", help_heading = WORKLOAD)]
    pub data_size_list: Option<String>,
    /// Keys per get: K or a range K1-K2.
    #[arg(long = "multi-key-get", value_name = "K", default_value = "1", help_heading = WORKLOAD)]
    pub multi_key_get: String,
    /// Expiry time of written items in seconds, uniform in MIN-MAX (0: never).
    #[arg(long = "expiry-range", value_name = "MIN-MAX", default_value = "0", help_heading = WORKLOAD)]
    pub expiry_range: String,
    /// Write every key once before the run, so gets hit.
    #[arg(long, help_heading = WORKLOAD)]
    pub prefill: bool,
    /// Check that values read back are what this workload writes.
    #[arg(long, help_heading = WORKLOAD)]
    pub verify: bool,
    /// Master seed of the random streams (one per thread).
    #[arg(long, value_name = "N", default_value_t = 1, help_heading = WORKLOAD)]
    pub seed: u64,
    /// Queues to spread the clients over (named q0, q1, ...; created if missing).
    #[arg(long, value_name = "N", default_value_t = 1, help_heading = MQ)]
    pub queues: u32,
    /// How a client receives: pop (POP, at most once), recv (RECV, then ACK of what came) or
    /// stream (the queues are Redis streams: XADD, XREADGROUP of one entry in group mwload, then its XACK).
    #[arg(long, value_name = "HOW", default_value = "pop", help_heading = MQ)]
    pub receive: String,
    /// Clients in pairs that send to each other (SEND ... TO partner) and
    /// receive what is addressed to them, so the queues stay the same size.
    #[arg(long, help_heading = MQ)]
    pub pairs: bool,
    /// Clients are named PREFIX0, PREFIX1, ... (CLIENT SETNAME) [default: mwload<pid>-].
    #[arg(long, value_name = "PREFIX", help_heading = MQ)]
    pub name_prefix: Option<String>,
    /// Write windows.jsonl and summary.json into this directory.
    #[arg(long, value_name = "DIR", help_heading = MEASUREMENT)]
    pub out: Option<PathBuf>,
    /// Window length in ms; windows start at wall-clock multiples.
    #[arg(long, value_name = "MS", default_value_t = 1000, help_heading = MEASUREMENT)]
    pub window_ms: u64,
    /// Name of this load generator in results files.
    #[arg(long, value_name = "NAME", default_value = "cl0", help_heading = MEASUREMENT)]
    pub instance: String,
    /// Accepted for memtier compatibility: mwload prints no histogram.
    #[arg(long, help_heading = MEASUREMENT)]
    pub hide_histogram: bool,
    /// The live one-line progress display: auto (on a terminal), always or never.
    #[arg(long, value_name = "WHEN", default_value = "auto", help_heading = PROCESS)]
    pub progress: String,
}

/// `--help`'s headings: the servers, the load, the workload, its message-queue
/// part, and measurement and process as mwproxy and mwmq name theirs.
const SERVERS: &str = "Servers";
const LOAD: &str = "Load";
const WORKLOAD: &str = "Workload";
const MQ: &str = "Message queues (-P mq)";
const MEASUREMENT: &str = "Measurement";
const PROCESS: &str = "Process";

/// `--help`'s last words: the exit statuses.
const AFTER_HELP: &str = "\
Exit status: 0 the run is to be trusted; 1 a connection failed at start, or was lost and not re-established, or \
nothing completed; 2 the flags were refused; 3 more requests failed than --max-error-rate; 4 values read back \
(--verify) were not those written.";

/// mwload's default port with `protocol`: the middleware it is made for
/// (mwproxy's 11311, or mwmq's 6380 with `-P mq`).
pub fn default_port(protocol: &str) -> u16 {
    if protocol == "mq" {
        6380
    } else {
        11311
    }
}

/// Think time in a closed loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Think {
    /// Send again at once.
    None,
    /// Always this many microseconds.
    Fixed(u64),
    /// Exponential with this mean in microseconds.
    Exponential(u64),
}

/// Open-loop arrival process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrivals {
    /// Exponential inter-arrival times.
    Poisson,
    /// Equal inter-arrival times.
    Fixed,
}

/// Closed or open loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// One request outstanding per virtual client.
    Closed {
        /// Think time.
        think: Think,
    },
    /// Requests at a target rate whatever the replies do.
    Open {
        /// Requests per second in all.
        rate: f64,
        /// Arrival process.
        arrivals: Arrivals,
    },
}

/// How an mq client receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Receive {
    /// `POP q`: take and delete.
    Pop,
    /// `RECV q`, then `ACK q id lease` of the message that came.
    RecvAck,
    /// Streams: `XADD q * body ...`; `XREADGROUP GROUP mwload me COUNT 1 STREAMS q >`, then `XACK q mwload id`.
    Stream,
}

/// The message-queue workload (`--protocol mq`).
#[derive(Clone, Debug, PartialEq)]
pub struct MqLoad {
    /// Queues `q0` .. `q{queues-1}`.
    pub queues: u32,
    /// POP or RECV+ACK.
    pub receive: Receive,
    /// Pairs of clients sending to each other.
    pub pairs: bool,
    /// Client names are this prefix and the client's number.
    pub name_prefix: String,
}

impl MqLoad {
    /// The queue of client number `g` (partners share one).
    pub fn queue_of(&self, g: usize) -> u32 {
        let unit = if self.pairs { g / 2 } else { g };
        (unit % self.queues as usize) as u32
    }

    /// The name of client number `g`.
    pub fn name_of(&self, g: usize) -> String {
        format!("{}{g}", self.name_prefix)
    }
}

/// A validated run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Targets.
    pub servers: Vec<ServerSpec>,
    /// Load threads.
    pub threads: usize,
    /// Connections per thread.
    pub connections: usize,
    /// Virtual clients per connection.
    pub virtual_clients: usize,
    /// Loop kind.
    pub mode: Mode,
    /// Measurement seconds (duration mode).
    pub test_time: Option<f64>,
    /// Requests per virtual client (count mode).
    pub requests: Option<u64>,
    /// Warm-up seconds.
    pub warmup: f64,
    /// Cool-down seconds.
    pub cooldown: f64,
    /// Keys, values, mix.
    pub workload: Workload,
    /// Write the key space first.
    pub prefill: bool,
    /// Check values read back.
    pub verify: bool,
    /// Reconnect lost connections.
    pub reconnect: bool,
    /// Master seed.
    pub seed: u64,
    /// Results directory.
    pub out: Option<PathBuf>,
    /// Window length.
    pub window_ms: u64,
    /// Instance name.
    pub instance: String,
    /// Error share above which the exit status is 3.
    pub max_error_rate: f64,
    /// Show the progress line.
    pub progress: bool,
    /// `Some`: speak to mwmq instead of memcached.
    pub mq: Option<MqLoad>,
    /// TLS and login.
    pub secure: Secure,
}

/// A command line mwload refuses, with the reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn err<T>(m: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(m.into()))
}

/// memcached reads an expiry time above 30 days as a Unix time.
const MAX_RELATIVE_EXPIRY: u64 = 30 * 24 * 3600;

fn range(s: &str, what: &str) -> Result<(u64, u64), ConfigError> {
    let parse = |x: &str| x.trim().parse::<u64>().map_err(|_| ConfigError(format!("{what}: {s:?} is not N or N-M")));
    match s.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (parse(a)?, parse(b)?);
            if a > b {
                return err(format!("{what}: {s:?} has its bounds reversed"));
            }
            Ok((a, b))
        }
        None => {
            let n = parse(s)?;
            Ok((n, n))
        }
    }
}

fn pattern(a: &Args) -> Result<KeyPattern, ConfigError> {
    let p = a.key_pattern.rsplit(':').next().unwrap_or("").to_ascii_lowercase();
    Ok(match p.as_str() {
        "uniform" | "r" | "random" => KeyPattern::Uniform,
        "sequential" | "s" => KeyPattern::Sequential,
        "gaussian" | "g" => {
            if a.key_stddev.is_nan() || a.key_stddev <= 0.0 || !(0.0..=1.0).contains(&a.key_median) {
                return err("gaussian keys need --key-stddev > 0 and --key-median in 0..1");
            }
            KeyPattern::Gaussian { median: a.key_median, stddev: a.key_stddev }
        }
        "zipf" | "z" => {
            if a.key_zipf_exp.is_nan() || a.key_zipf_exp <= 0.0 {
                return err("--key-zipf-exp must be > 0");
            }
            KeyPattern::Zipf { exponent: a.key_zipf_exp }
        }
        _ => return err(format!("--key-pattern {:?}: use uniform, sequential, gaussian or zipf", a.key_pattern)),
    })
}

fn values(a: &Args) -> Result<ValueSizes, ConfigError> {
    const MAX: usize = 1 << 20;
    let v = if let Some(list) = &a.data_size_list {
        let mut v = Vec::new();
        for item in list.split(',') {
            let (size, w) = item
                .split_once(':')
                .ok_or_else(|| ConfigError(format!("--data-size-list item {item:?} is not SIZE:WEIGHT")))?;
            let size: usize = size.parse().map_err(|_| ConfigError(format!("--data-size-list: bad size {size:?}")))?;
            let w: u32 = w.parse().map_err(|_| ConfigError(format!("--data-size-list: bad weight {w:?}")))?;
            v.push((size, w));
        }
        if v.iter().all(|(_, w)| *w == 0) {
            return err("--data-size-list needs a positive weight");
        }
        ValueSizes::Weighted(v)
    } else if let Some(r) = &a.data_size_range {
        let (lo, hi) = range(r, "--data-size-range")?;
        ValueSizes::Range(lo as usize, hi as usize)
    } else {
        ValueSizes::Fixed(a.data_size)
    };
    if v.max() > MAX {
        return err(format!("values larger than {MAX} bytes are refused by memcached's default item size"));
    }
    Ok(v)
}

impl Args {
    /// Checks everything and resolves the targets.
    pub fn validate(&self) -> Result<RunConfig, ConfigError> {
        let servers = if self.servers.is_empty() {
            let port = self.port.unwrap_or_else(|| default_port(&self.protocol));
            vec![format!("{}:{port}", self.server).parse::<ServerSpec>().map_err(|e| ConfigError(e.0))?]
        } else {
            self.servers.clone()
        };
        if self.threads == 0 || self.threads > 256 {
            return err("--threads must be 1..=256");
        }
        if self.clients == 0 || self.virtual_clients == 0 {
            return err("--clients and --virtual-clients must be at least 1");
        }
        let mq = match self.protocol.as_str() {
            "memcache_text" => None,
            "mq" => Some(self.mq_load(&servers)?),
            p => return err(format!("--protocol {p:?}: use memcache_text (memcached) or mq (mwmq)")),
        };
        let (elo, ehi) = range(&self.expiry_range, "--expiry-range")?;
        if ehi > MAX_RELATIVE_EXPIRY {
            return err(format!(
                "--expiry-range: at most {MAX_RELATIVE_EXPIRY} s (memcached reads a larger number as a date)"
            ));
        }
        let (sets, gets) = self
            .ratio
            .split_once(':')
            .and_then(|(s, g)| Some((s.parse::<u32>().ok()?, g.parse::<u32>().ok()?)))
            .ok_or_else(|| ConfigError(format!("--ratio {:?}: expected SETS:GETS such as 1:10", self.ratio)))?;
        if sets + gets == 0 {
            return err("--ratio 0:0 sends nothing");
        }
        if !(0.0..1.0).contains(&self.delete_share) {
            return err("--delete-share must be in [0, 1)");
        }
        if self.key_minimum > self.key_maximum {
            return err("--key-minimum is above --key-maximum");
        }
        if self.key_size > 250 {
            return err("--key-size over 250: memcached refuses such keys");
        }
        let (mlo, mhi) = range(&self.multi_key_get, "--multi-key-get")?;
        if mlo == 0 || mhi > 10_000 {
            return err("--multi-key-get must be 1..=10000 keys");
        }
        let think = match (self.think_time, self.think_dist.as_str()) {
            (0, _) => Think::None,
            (t, "fixed") => Think::Fixed(t),
            (t, "exponential" | "exp") => Think::Exponential(t),
            (_, d) => return err(format!("--think-dist {d:?}: use fixed or exponential")),
        };
        let mode = match self.rate {
            Some(r) if r > 0.0 && r.is_finite() => {
                let arrivals = match self.arrival.as_str() {
                    "poisson" => Arrivals::Poisson,
                    "fixed" => Arrivals::Fixed,
                    a => return err(format!("--arrival {a:?}: use poisson or fixed")),
                };
                if self.requests.is_some() {
                    return err("-n/--requests counts a closed loop's requests; give --test-time with --rate");
                }
                Mode::Open { rate: r, arrivals }
            }
            Some(r) => return err(format!("--rate must be a positive number, not {r}")),
            None => Mode::Closed { think },
        };
        if self.test_time.is_some() && self.requests.is_some() {
            return err("give either --test-time or -n/--requests, not both");
        }
        let test_time = match (self.test_time, self.requests) {
            (Some(t), _) if t.is_nan() || t <= 0.0 => return err("--test-time must be positive"),
            (Some(t), _) => Some(t),
            (None, None) => Some(10.0),
            (None, Some(_)) => None,
        };
        if self.warmup < 0.0 || self.cooldown < 0.0 {
            return err("--warmup and --cooldown cannot be negative");
        }
        if !(0.0..=1.0).contains(&self.max_error_rate) {
            return err("--max-error-rate must be in [0, 1]");
        }
        if self.window_ms < 10 {
            return err("--window-ms must be at least 10");
        }
        let progress = match self.progress.as_str() {
            "auto" => std::io::IsTerminal::is_terminal(&std::io::stderr()),
            "always" => true,
            "never" => false,
            p => return err(format!("--progress {p:?}: use auto, always or never")),
        };
        let workload = Workload {
            key_prefix: self.key_prefix.clone(),
            key_size: self.key_size,
            key_min: self.key_minimum,
            key_max: self.key_maximum,
            pattern: pattern(self)?,
            values: values(self)?,
            sets,
            gets,
            delete_share: self.delete_share,
            multiget: (mlo as u32, mhi as u32),
            expiry: (elo as u32, ehi as u32),
        };
        Ok(RunConfig {
            servers,
            threads: self.threads,
            connections: self.clients,
            virtual_clients: if matches!(mode, Mode::Open { .. }) { 1 } else { self.virtual_clients },
            mode,
            test_time,
            requests: self.requests,
            warmup: self.warmup,
            cooldown: self.cooldown,
            workload,
            prefill: self.prefill,
            verify: self.verify,
            reconnect: self.reconnect,
            seed: self.seed,
            out: self.out.clone(),
            window_ms: self.window_ms,
            instance: self.instance.clone(),
            max_error_rate: self.max_error_rate,
            progress,
            secure: self.secure()?,
            mq,
        })
    }

    fn secure(&self) -> Result<Secure, ConfigError> {
        if self.auth.is_some() && self.protocol == "mq" {
            return err("--auth logs in to memcached and mwproxy; mwmq's identities are not spoken yet");
        }
        let (ca, name) = (self.tls_ca.as_deref(), self.tls_server_name.as_deref());
        Secure::from_flags(self.tls, ca, name, self.auth.as_deref()).map_err(|e| ConfigError(e.to_string()))
    }

    fn mq_load(&self, servers: &[ServerSpec]) -> Result<MqLoad, ConfigError> {
        if servers.len() != 1 {
            return err("--protocol mq talks to one mwmq; run one mwload per middleware");
        }
        if self.multi_key_get != "1" || self.delete_share > 0.0 || self.verify || self.prefill {
            return err("--protocol mq has no multi-gets, deletes, --verify or --prefill");
        }
        if self.queues == 0 || self.queues > 100_000 {
            return err("--queues must be 1..=100000");
        }
        let receive = match self.receive.as_str() {
            "pop" => Receive::Pop,
            "recv" => Receive::RecvAck,
            "stream" => Receive::Stream,
            r => return err(format!("--receive {r:?}: use pop, recv or stream")),
        };
        if self.pairs && (self.threads * self.clients) % 2 == 1 {
            return err("--pairs needs an even number of clients (threads x clients)");
        }
        let name_prefix = self.name_prefix.clone().unwrap_or_else(|| format!("mwload{}-", std::process::id()));
        if name_prefix.is_empty() || name_prefix.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
            return err("--name-prefix must be a non-empty word");
        }
        Ok(MqLoad { queues: self.queues, receive, pairs: self.pairs, name_prefix })
    }
}

impl RunConfig {
    /// Resolves every target.
    pub fn resolve(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        self.servers
            .iter()
            .map(|s| {
                (s.host.as_str(), s.port)
                    .to_socket_addrs()
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or_else(|| ConfigError(format!("cannot resolve {}", s.endpoint())))
            })
            .collect()
    }

    /// The configuration as JSON, for the summary's metadata.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "servers": self.servers.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            "threads": self.threads,
            "connections_per_thread": self.connections,
            "virtual_clients": self.virtual_clients,
            "mode": format!("{:?}", self.mode),
            "test_time": self.test_time,
            "requests": self.requests,
            "warmup": self.warmup,
            "cooldown": self.cooldown,
            "workload": format!("{:?}", self.workload),
            "prefill": self.prefill,
            "verify": self.verify,
            "reconnect": self.reconnect,
            "seed": self.seed,
            "window_ms": self.window_ms,
            "protocol": if self.mq.is_some() { "mq" } else { "memcache_text" },
            "mq": self.mq.as_ref().map(|m| format!("{m:?}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<RunConfig, ConfigError> {
        Args::try_parse_from(std::iter::once("mwload").chain(args.iter().copied())).unwrap().validate()
    }

    /// The default port was memcached's 11211 while mwproxy listens on
    /// 11311: `mwload` beside a default `mwproxy` loaded memcached (or
    /// nothing). Now it is the middleware's of the protocol: mwproxy's, or
    /// mwmq's with `-P mq`; memcached itself is a `-p 11211` away.
    #[test]
    fn the_default_port_is_the_middlewares() {
        assert_eq!(parse(&[]).unwrap().servers[0].endpoint(), "127.0.0.1:11311");
        let mq = parse(&["-P", "mq"]).unwrap();
        assert_eq!(mq.servers[0].endpoint(), "127.0.0.1:6380");
        assert_eq!(parse(&["-p", "11211"]).unwrap().servers[0].endpoint(), "127.0.0.1:11211");
    }

    #[test]
    fn memtier_spellings() {
        let c = parse(&[
            "-s",
            "10.0.0.1",
            "-p",
            "11212",
            "-t",
            "4",
            "-c",
            "8",
            "--ratio",
            "1:0",
            "--test-time",
            "5",
            "--key-maximum",
            "100",
            "--key-pattern",
            "R:R",
            "-d",
            "4096",
            "--multi-key-get",
            "3",
        ])
        .unwrap();
        assert_eq!(c.servers[0].endpoint(), "10.0.0.1:11212");
        assert_eq!((c.threads, c.connections, c.workload.sets, c.workload.gets), (4, 8, 1, 0));
        assert_eq!(c.workload.values, ValueSizes::Fixed(4096));
        assert_eq!(c.workload.multiget, (3, 3));
        assert_eq!(c.workload.pattern, KeyPattern::Uniform);
    }

    #[test]
    fn refusals_explain() {
        for (args, needle) in [
            (&["--ratio", "x"][..], "--ratio"),
            (&["--key-pattern", "weird"][..], "key-pattern"),
            (&["--multi-key-get", "5-2"][..], "reversed"),
            (&["--rate=-5"][..], "--rate"),
            (&["--rate", "100", "-n", "5"][..], "--test-time"),
            (&["--test-time", "1", "-n", "5"][..], "either"),
            (&["--data-size-list", "10:x"][..], "weight"),
            (&["--think-time", "5", "--think-dist", "odd"][..], "think-dist"),
            (&["-d", "2000000"][..], "larger"),
            (&["-P", "redis"][..], "use memcache_text"),
            (&["-P", "mq", "--servers", "a:1,b:2"][..], "one mwmq"),
            (&["-P", "mq", "--multi-key-get", "3"][..], "multi-gets"),
            (&["-P", "mq", "--receive", "peek"][..], "--receive"),
            (&["-P", "mq", "--pairs", "-t", "1", "-c", "3"][..], "even"),
        ] {
            let e = parse(args).unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }

    #[test]
    fn open_loop_and_sizes() {
        let c = parse(&[
            "--rate",
            "1000",
            "--arrival",
            "fixed",
            "--data-size-list",
            "100:3,1000:1",
            "--key-pattern",
            "zipf",
        ])
        .unwrap();
        assert_eq!(c.mode, Mode::Open { rate: 1000.0, arrivals: Arrivals::Fixed });
        assert_eq!(c.workload.values, ValueSizes::Weighted(vec![(100, 3), (1000, 1)]));
        assert_eq!(c.test_time, Some(10.0));
    }

    #[test]
    fn message_queue_load() {
        let c =
            parse(&["-P", "mq", "-p", "6380", "--queues", "3", "--receive", "recv", "--pairs", "--name-prefix", "m1-"])
                .unwrap();
        let m = c.mq.unwrap();
        assert_eq!((m.queues, m.receive, m.pairs), (3, Receive::RecvAck, true));
        // Partners share a queue; pairs are spread over the queues.
        assert_eq!((0..8).map(|g| m.queue_of(g)).collect::<Vec<_>>(), [0, 0, 1, 1, 2, 2, 0, 0]);
        assert_eq!(m.name_of(5), "m1-5");
        assert!(parse(&[]).unwrap().mq.is_none());
    }
}
