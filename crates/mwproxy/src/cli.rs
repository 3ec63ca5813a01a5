//! The command line: every configuration setting as a flag, the seed reports'
//! short flags (`-l ip -p port -t workers -s true|false -m server...`, and
//! `-r` for the replication factor), and how flags override a config file.

use clap::Parser;

use mwserve::cli::heading::{CLIENTS, ENGINE, SERVERS};
use mwserve::cli::{set, EngineFlag, ServerArgs};

use crate::config::{
    Config, ConfigError, Engine, HashKind, KeyHash, MultigetFailure, MultigetMode, ReadPolicy, ServerSpec,
};

/// mwproxy: a memcached middleware (consistent hashing, replication, sharded multi-gets).
#[derive(Parser, Debug, Default)]
#[command(name = "mwproxy", version, about, long_about = None, after_long_help = AFTER_HELP)]
pub struct Cli {
    /// Listening IP (overrides the host part of --listen).
    #[arg(short = 'l', long = "listen-ip", value_name = "IP", help_heading = CLIENTS)]
    pub listen_ip: Option<String>,
    /// Listening port (overrides the port part of --listen).
    #[arg(short = 'p', long, value_name = "PORT", help_heading = CLIENTS)]
    pub port: Option<u16>,
    /// Listen on this unix socket instead of TCP (as memcached's flag).
    #[arg(long = "unix-socket", value_name = "PATH", conflicts_with_all = ["listen_ip", "port"], help_heading = CLIENTS)]
    pub unix_socket: Option<std::path::PathBuf>,
    /// The unix socket's permissions in octal, e.g. 0660 [default: what the umask leaves].
    #[arg(long = "unix-mask", value_name = "OCTAL", requires = "unix_socket", help_heading = CLIENTS)]
    pub unix_mask: Option<String>,
    /// Clients must log in first, as with memcached -Y: a file of user:password lines.
    #[arg(long, value_name = "FILE", help_heading = CLIENTS)]
    pub auth_file: Option<String>,
    /// Accept users files that every user of this machine may read (refused otherwise).
    #[arg(long, help_heading = CLIENTS)]
    pub allow_readable_secrets: bool,
    /// memcached servers, host:port[:weight], space- or comma-separated.
    #[arg(short = 'm', long = "servers", value_name = "SERVER", num_args = 1.., value_delimiter = ',', help_heading = SERVERS)]
    pub servers: Vec<ServerSpec>,
    /// Backend connect timeout in ms [default: 500].
    #[arg(long, value_name = "MS", help_heading = SERVERS)]
    pub connect_timeout_ms: Option<u64>,
    /// Backend reply timeout in ms [default: 1000].
    #[arg(long, value_name = "MS", help_heading = SERVERS)]
    pub timeout_ms: Option<u64>,
    /// First reconnection backoff in ms, doubled per failure [default: 100].
    #[arg(long, value_name = "MS", help_heading = SERVERS)]
    pub retry_min_ms: Option<u64>,
    /// Longest reconnection backoff in ms [default: 2000].
    #[arg(long, value_name = "MS", help_heading = SERVERS)]
    pub retry_max_ms: Option<u64>,
    /// A server silent this long while others answer is stalled, 0 = off [default: 50].
    #[arg(long, value_name = "MS", help_heading = SERVERS)]
    pub stall_ms: Option<u64>,
    /// Ask each server `version` at start, and one no request reached for this long (a down one when its
    /// backoff ends), 0 = off [default: 1000].
    #[arg(long, value_name = "MS", help_heading = SERVERS)]
    pub check_ms: Option<u64>,
    /// Speak TLS to the servers (memcached -Z); needs --server-tls-ca.
    #[arg(long, help_heading = SERVERS)]
    pub server_tls: bool,
    /// PEM CA certificates that signed the servers' certificates.
    #[arg(long, value_name = "FILE", help_heading = SERVERS)]
    pub server_tls_ca: Option<String>,
    /// The name in the servers' certificates [default: each server's host].
    #[arg(long, value_name = "NAME", help_heading = SERVERS)]
    pub server_tls_name: Option<String>,
    /// Log in to servers started with memcached -Y: a file whose first line is user:password.
    #[arg(long, value_name = "FILE", help_heading = SERVERS)]
    pub server_auth_file: Option<String>,
    /// How requests are carried out: async (event loops with pipelined
    /// server connections) or pool (net thread, queue, workers: the seed
    /// reports' architecture) [default: async].
    #[arg(long, value_enum, help_heading = ENGINE)]
    pub engine: Option<Engine>,
    /// Event loops of the async engine, 0 = half the cores, at least one (the pool engine's
    /// threads are -t/--workers) [default: 0].
    #[arg(long, value_name = "N", help_heading = ENGINE)]
    pub threads: Option<usize>,
    /// Threads of the pool engine that accept, read and parse (the async engine's loops do it) [default: 1].
    #[arg(long, value_name = "N", help_heading = ENGINE)]
    pub net_threads: Option<usize>,
    /// Unread replies plus waiting requests of all clients, in bytes [default: 256m].
    #[arg(long, value_name = "BYTES", value_parser = parse_size, help_heading = ENGINE)]
    pub memory_budget: Option<usize>,
    /// Largest value in bytes; k and m suffixes allowed [default: 1m].
    #[arg(long, value_name = "BYTES", value_parser = parse_size, help_heading = CLIENTS)]
    pub max_value_size: Option<usize>,
    /// Largest reply to one retrieval, in bytes [default: 32m].
    #[arg(long, value_name = "BYTES", value_parser = parse_size, help_heading = CLIENTS)]
    pub max_reply_size: Option<usize>,
    /// Replication factor R: copies of each key, 1..=servers [default: 1].
    #[arg(short = 'r', long, value_name = "R", help_heading = ROUTING)]
    pub replication: Option<usize>,
    /// Which replica serves reads [default: round-robin].
    #[arg(long, value_enum, help_heading = ROUTING)]
    pub read_policy: Option<ReadPolicy>,
    /// Multi-gets when every server has every key [default: sharded].
    #[arg(long, value_enum, help_heading = ROUTING)]
    pub multiget: Option<MultigetMode>,
    /// Seed-report spelling of --multiget: true = sharded, false = non-sharded.
    #[arg(long = "sharded", value_name = "true|false", value_parser = parse_bool, help_heading = ROUTING)]
    pub sharded: Option<bool>,
    /// `-s true|false`: the seed reports' --sharded; `-s PORT`: twemproxy's
    /// stats port (--stats-port).
    #[arg(short = 's', value_name = "true|false|PORT", value_parser = parse_s, help_heading = ROUTING)]
    pub short_s: Option<ShortS>,
    /// Multi-get answer when some servers fail [default: partial].
    #[arg(long, value_enum, help_heading = ROUTING)]
    pub multiget_failure: Option<MultigetFailure>,
    /// Replicas that must confirm a write, 0 = all [default: 0].
    #[arg(long, value_name = "N", help_heading = ROUTING)]
    pub write_quorum: Option<usize>,
    /// On a miss, look the key up on the next replica too.
    #[arg(long, help_heading = ROUTING)]
    pub miss_failover: bool,
    /// Key placement [default: ketama].
    #[arg(long, value_enum, help_heading = ROUTING)]
    pub hash: Option<HashKind>,
    /// The function that hashes keys, by twemproxy's name: md5, one_at_a_time, crc16, crc32,
    /// crc32a, fnv1_64, fnv1a_64, fnv1_32, fnv1a_32, hsieh, murmur, jenkins [default: md5].
    #[arg(long, value_name = "NAME", value_parser = |s: &str| s.parse::<KeyHash>(), help_heading = ROUTING)]
    pub key_hash: Option<KeyHash>,
    /// Hash only the part of a key between these two characters, e.g. "{}" [default: none].
    #[arg(long, value_name = "XY", help_heading = ROUTING)]
    pub hash_tag: Option<String>,
    /// twemproxy's configuration file (nutcracker.yml): every memcached pool
    /// served by this process (`-c FILE.yml` says the same).
    #[arg(long, value_name = "FILE", help_heading = TWEMPROXY)]
    pub twemproxy_config: Option<std::path::PathBuf>,
    /// mcrouter's JSON configuration: its pools and route, served as a
    /// route tree (docs/mcrouter.md); `--config` may give mwproxy's other settings.
    #[arg(long, value_name = "FILE", help_heading = ROUTING)]
    pub mcrouter_config: Option<std::path::PathBuf>,
    /// mcrouter's JSON configuration given on the command line itself
    /// (mcrouter's --config-str); a SIGHUP reads it again, unchanged.
    #[arg(long, value_name = "JSON", conflicts_with = "mcrouter_config", help_heading = ROUTING)]
    pub mcrouter_config_str: Option<String>,
    /// The routing prefix this host serves, /region/cluster/ (mcrouter's -R): of the mcrouter
    /// file's several `routes` entries, the one whose aliases hold it.
    #[arg(long, value_name = "PREFIX", help_heading = ROUTING)]
    pub route_prefix: Option<String>,
    /// Serve twemproxy's stats JSON on this port (twemproxy's -s) [default: off; 22222 with a
    /// twemproxy configuration file].
    #[arg(long, value_name = "PORT", help_heading = TWEMPROXY)]
    pub stats_port: Option<u16>,
    /// The address of the stats port (twemproxy's -a) [default: 127.0.0.1].
    #[arg(short = 'a', long, value_name = "ADDR", help_heading = TWEMPROXY)]
    pub stats_addr: Option<String>,
    /// The flags every middleware has (listen address, TLS, results, admin, config file, logs).
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `--help`'s last words: signals and exit statuses.
const AFTER_HELP: &str = "\
Signals: SIGTERM or SIGINT stop it once requests received are answered; SIGHUP reloads the configuration file.
Exit status: 0 stopped by a signal, 1 could not start, 2 the flags or the configuration were refused.
Run as `nutcracker` (or `mwproxy nutcracker ...`), it takes twemproxy's command line instead.";

/// `--help`'s headings of mwproxy's own (the others are every program's: `mwserve::cli::heading`).
const ROUTING: &str = "Routing";
const TWEMPROXY: &str = "twemproxy";

pub use mwserve::process::{parse_bool, parse_size};

/// What `-s` means: the seed reports' sharded flag, or twemproxy's stats port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShortS {
    /// `-s true|false`.
    Sharded(bool),
    /// `-s PORT`.
    StatsPort(u16),
}

fn parse_s(v: &str) -> Result<ShortS, String> {
    if let Ok(port) = v.parse::<u16>() {
        return Ok(ShortS::StatsPort(port));
    }
    parse_bool(v).map(ShortS::Sharded).map_err(|_| format!("{v:?}: true, false or a port number"))
}

/// twemproxy's stats port when nothing else is said.
pub const STATS_PORT: u16 = 22222;

impl Cli {
    /// The flags given that only one engine reads, for
    /// [`mwserve::cli::unread_flags`]: the pool engine's threads, net
    /// threads and queue, the async engine's loops.
    pub fn engine_flags(&self) -> Vec<EngineFlag> {
        let shown = |n: Option<usize>| n.map(|n| n.to_string());
        vec![
            EngineFlag {
                flag: "-t/--workers",
                given: shown(self.server.workers),
                read_by: Engine::Pool,
                instead: "its event loops are --threads (0 = half the cores), or choose --engine pool",
            },
            EngineFlag {
                flag: "--net-threads",
                given: shown(self.net_threads),
                read_by: Engine::Pool,
                instead: "its event loops (--threads) accept, read and parse",
            },
            EngineFlag {
                flag: "--queue-capacity",
                given: shown(self.server.queue_capacity),
                read_by: Engine::Pool,
                instead: "it has no request queue; --memory-budget bounds what clients leave waiting",
            },
            EngineFlag {
                flag: "--threads",
                given: shown(self.threads),
                read_by: Engine::Async,
                instead: "its worker threads are -t/--workers, its net threads --net-threads",
            },
        ]
    }

    /// Serves the configuration these flags give, in the shell every
    /// middleware shares (reload on SIGHUP, stop on SIGTERM), warning of the
    /// flags its engine ignores: mwproxy's and mcrouter's command lines end here.
    pub fn serve(self) -> std::process::ExitCode {
        let args = self.server.clone();
        let flags = self.engine_flags();
        let unread = move |c: &Config| mwserve::cli::unread_flags(c.proxy.engine, &flags);
        mwserve::cli::serve::<crate::Proxy>(&args, move || self.to_config(), unread)
    }

    /// The configuration: the file (if any), then every flag given.
    pub fn to_config(&self) -> Result<Config, ConfigError> {
        use crate::routes::mcrouter::{install, Source};
        let mcrouter = self.mcrouter_file();
        let mut c: Config = match &self.server.config {
            // (`-c FILE.json` is mcrouter's file: mwproxy's settings are then the defaults and flags.)
            Some(p) if mcrouter.as_ref() == Some(p) => {
                mwserve::cli::ServerArgs { config: None, ..self.server.clone() }.load()?
            }
            _ => self.server.load().map_err(|e| self.json_hint(e))?,
        };
        let prefix = self.route_prefix.as_deref();
        match (&mcrouter, &self.mcrouter_config_str) {
            (Some(_), Some(_)) => {
                return Err(ConfigError("--mcrouter-config-str and an mcrouter file: give the JSON once".into()))
            }
            (Some(path), None) => install(&mut c, Source::File(path), prefix)?,
            (None, Some(text)) => install(&mut c, Source::Text(text), prefix)?,
            (None, None) if prefix.is_some() => {
                return Err(ConfigError(
                    "--route-prefix chooses among an mcrouter file's routes: give the file (--mcrouter-config)".into(),
                ))
            }
            (None, None) => {}
        }
        self.apply(c)
    }

    /// A configuration file that would not parse as TOML but reads as JSON
    /// is likely mcrouter's under another name: the error says what to do.
    fn json_hint(&self, e: ConfigError) -> ConfigError {
        let text = self.server.config.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
        // (A TOML file never starts with `{`, `//` or `/*`; mcrouter's may.)
        let json = |t: &str| ["{", "//", "/*"].iter().any(|s| t.trim_start().starts_with(s));
        if text.is_some_and(|t| json(&t)) {
            return ConfigError(format!(
                "{}\n(this file looks like JSON: for mcrouter's file, give it with --mcrouter-config FILE, \
                 or name it .json)",
                e.0.trim_end()
            ));
        }
        e
    }

    /// mcrouter's file to serve, when one is given (`--mcrouter-config`, or `-c` naming a .json file).
    pub fn mcrouter_file(&self) -> Option<std::path::PathBuf> {
        self.mcrouter_config
            .clone()
            .or_else(|| self.server.config.clone().filter(|p| crate::routes::mcrouter::is_json(p)))
    }

    /// The twemproxy file to serve, when one is given (`--twemproxy-config`, or `-c` naming a .yml file).
    pub fn twemproxy_file(&self) -> Option<std::path::PathBuf> {
        self.twemproxy_config.clone().or_else(|| self.server.config.clone().filter(|p| crate::twemproxy::is_yaml(p)))
    }

    /// Where twemproxy's stats are served: `--stats-port`/`-s PORT`, or
    /// 22222 with a twemproxy file; with `--stats-addr` (default 127.0.0.1).
    pub fn stats_listen(&self) -> Option<String> {
        let port = self
            .stats_port
            .or(match self.short_s {
                Some(ShortS::StatsPort(p)) => Some(p),
                _ => None,
            })
            .or(self.twemproxy_file().map(|_| STATS_PORT))?;
        let host = self.stats_addr.clone().unwrap_or_else(|| "127.0.0.1".into());
        Some(if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") })
    }

    /// A twemproxy pool's configuration with the flags given laid over it.
    pub fn pool_config(&self, pool: &crate::twemproxy::Pool) -> Result<Config, ConfigError> {
        use mwserve::config::ServiceConfig;
        let mut flags = self.server.clone();
        flags.config = None;
        let c = Config::from_table(pool.doc.clone(), flags.overlay::<Config>())
            .map_err(|e| ConfigError(format!("pool {}: {}", pool.name, e.0)))?;
        self.apply(c).map_err(|e| ConfigError(format!("pool {}: {}", pool.name, e.0)))
    }

    /// Flags that would give every pool of a file the same address or directory.
    pub fn one_pool_flags(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let given = [
            ("--listen", self.server.listen.is_some()),
            ("-l/--listen-ip", self.listen_ip.is_some()),
            ("--unix-socket", self.unix_socket.is_some()),
            ("-p/--port", self.port.is_some()),
            ("-m/--servers", !self.servers.is_empty()),
            ("--admin", self.server.admin.is_some()),
            ("--out", self.server.out.is_some()),
            ("--instance", self.server.instance.is_some()),
            ("--plain-listen", self.server.plain_listen.is_some()),
        ];
        for (flag, on) in given {
            if on {
                out.push(flag);
            }
        }
        out
    }

    /// Every flag given, over `c`.
    fn apply(&self, mut c: Config) -> Result<Config, ConfigError> {
        if self.listen_ip.is_some() || self.port.is_some() {
            let (host, port) = c.proxy.listen.rsplit_once(':').unwrap_or(("127.0.0.1", "11311"));
            let host = self.listen_ip.clone().unwrap_or_else(|| host.to_string());
            let port = self.port.map(|p| p.to_string()).unwrap_or_else(|| port.to_string());
            c.proxy.listen = if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
        }
        if let Some(path) = &self.unix_socket {
            let path = std::path::absolute(path).map_err(|e| ConfigError(format!("--unix-socket {path:?}: {e}")))?;
            let path = path.to_str().ok_or_else(|| ConfigError(format!("--unix-socket {path:?}: not UTF-8")))?;
            c.proxy.listen = match &self.unix_mask {
                Some(mask) => format!("{path} {mask}"),
                None => path.to_string(),
            };
        }
        if !self.servers.is_empty() {
            c.routing.servers = self.servers.clone();
        }
        set(&mut c.proxy.engine, self.engine);
        set(&mut c.proxy.threads, self.threads);
        set(&mut c.proxy.net_threads, self.net_threads);
        set(&mut c.routing.replication, self.replication);
        set(&mut c.routing.read_policy, self.read_policy);
        set(&mut c.routing.multiget, self.multiget);
        let sharded = match self.short_s {
            Some(ShortS::Sharded(b)) => Some(b),
            _ => self.sharded,
        };
        if let Some(s) = sharded {
            c.routing.multiget = if s { MultigetMode::Sharded } else { MultigetMode::NonSharded };
        }
        set(&mut c.routing.multiget_failure, self.multiget_failure);
        set(&mut c.routing.hash, self.hash);
        set(&mut c.routing.key_hash, self.key_hash);
        if let Some(tag) = &self.hash_tag {
            c.routing.hash_tag = tag.clone();
        }
        set(&mut c.backend.connect_timeout_ms, self.connect_timeout_ms);
        set(&mut c.backend.timeout_ms, self.timeout_ms);
        set(&mut c.backend.retry_min_ms, self.retry_min_ms);
        set(&mut c.backend.retry_max_ms, self.retry_max_ms);
        set(&mut c.limits.max_value_size, self.max_value_size);
        set(&mut c.routing.write_quorum, self.write_quorum);
        if self.miss_failover {
            c.routing.miss_failover = true;
        }
        set(&mut c.backend.stall_ms, self.stall_ms);
        set(&mut c.backend.check_ms, self.check_ms);
        set(&mut c.proxy.memory_budget, self.memory_budget);
        set(&mut c.limits.max_reply_size, self.max_reply_size);
        let some = |field: &mut Option<String>, flag: &Option<String>| {
            if flag.is_some() {
                field.clone_from(flag);
            }
        };
        some(&mut c.auth.file, &self.auth_file);
        some(&mut c.backend.tls_ca, &self.server_tls_ca);
        some(&mut c.backend.tls_server_name, &self.server_tls_name);
        some(&mut c.backend.auth_file, &self.server_auth_file);
        if self.allow_readable_secrets {
            c.auth.allow_readable_secrets = true;
        }
        if self.server_tls {
            c.backend.tls = true;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("mwproxy").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn seed_report_flags() {
        let c = cli(&["-l", "10.0.0.5", "-p", "11212", "-t", "32", "-s", "false", "-m", "a:1", "b:2", "-r", "2"])
            .to_config()
            .unwrap();
        assert_eq!(c.proxy.listen, "10.0.0.5:11212");
        assert_eq!(c.proxy.workers, 32);
        assert_eq!(c.routing.multiget, MultigetMode::NonSharded);
        assert_eq!(c.routing.servers.len(), 2);
        assert_eq!(c.routing.replication, 2);
        // `-l`/`-p` override the host and the port of `--listen`.
        let c = cli(&["--listen", "0.0.0.0:1", "-p", "2"]).to_config().unwrap();
        assert_eq!(c.proxy.listen, "0.0.0.0:2");
    }

    #[test]
    fn memcached_unix_socket_flags() {
        use mwserve::config::ServiceConfig;
        let c =
            cli(&["--unix-socket", "/run/mw.sock", "--unix-mask", "0660", "-m", "/run/mc.sock:2"]).to_config().unwrap();
        assert_eq!(c.proxy.listen, "/run/mw.sock 0660");
        assert!(c.routing.servers[0].is_unix() && c.routing.servers[0].weight == 2);
        let bad =
            cli(&["--unix-socket", "/run/mw.sock", "--unix-mask", "rw"]).to_config().unwrap().validate().unwrap_err();
        assert!(bad.0.contains("octal"), "{bad}");
        let both = Cli::try_parse_from(["mwproxy", "--unix-socket", "/run/mw.sock", "-p", "1"]);
        assert!(both.is_err(), "a unix socket or a port, not both");
    }

    #[test]
    fn long_flags_and_sizes() {
        let c =
            cli(&["--servers", "a:1,b:2:3", "--read-policy", "primary", "--max-value-size", "2m", "--hash", "modula"])
                .to_config()
                .unwrap();
        assert_eq!(c.routing.servers[1].weight, 3);
        assert_eq!(c.routing.read_policy, ReadPolicy::Primary);
        assert_eq!(c.limits.max_value_size, 2 << 20);
        assert_eq!(c.routing.hash, HashKind::Modula);
        assert!(parse_size("12q").is_err());
        assert!(Cli::try_parse_from(["mwproxy", "-s", "maybe"]).is_err());
        assert!(Cli::try_parse_from(["mwproxy", "--bogus"]).is_err());
    }

    const MCROUTER_JSON: &str = r#"{ "pools": { "A": { "servers": ["h:1"] }, "B": { "servers": ["h:2"] } },
        "routes": [{ "aliases": ["/r/a/"], "route": "Pool|A" }, { "aliases": ["/r/b/"], "route": "Pool|B" }] }"#;

    #[test]
    fn mcrouter_json_given_inline_with_a_route_prefix() {
        let json = MCROUTER_JSON;
        let c = cli(&["--mcrouter-config-str", json, "--route-prefix", "/r/b/"]).to_config().unwrap();
        assert_eq!(c.route.unwrap().value.as_str(), Some("B"));
        let e = cli(&["--mcrouter-config-str", json]).to_config().unwrap_err();
        assert!(e.0.contains("--route-prefix"), "{e}");
        let e = cli(&["--route-prefix", "/r/b/"]).to_config().unwrap_err();
        assert!(e.0.contains("--mcrouter-config"), "{e}");
    }

    /// mcrouter's file under a name that is not .json: TOML's error, and what to do.
    #[test]
    fn json_given_as_mwproxys_file_is_pointed_to_mcrouter_config() {
        let json = MCROUTER_JSON;
        let path = std::env::temp_dir().join(format!("mwproxy-cli-{}.conf", std::process::id()));
        std::fs::write(&path, format!("// mcrouter's\n{json}")).unwrap();
        let e = cli(&["-c", path.to_str().unwrap()]).to_config().unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(
            e.0.contains("TOML parse error")
                && e.0.contains("looks like JSON: for mcrouter's file, give it with --mcrouter-config"),
            "{e}"
        );
    }
}
