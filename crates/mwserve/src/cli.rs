//! The command line every middleware shares (flattened into each one's own
//! flags) and what its `main` does with it: read the configuration, warn
//! about flags the engine in use ignores, print it or start, stop cleanly on
//! SIGTERM or SIGINT. `--help` groups every program's flags under the same
//! headings and shows the configuration's defaults ([`command`]).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::config::{Common, ConfigError, Engine, ServiceConfig};
use crate::process::{catch_signals, init_logging, LogFormat};
use crate::shell::{Reload, Source};
use crate::shell::{Shell, Stopper};
use crate::start::StartError;

/// The headings `--help` groups the flags under, the same in every program
/// of the workspace (mwproxy, mwmq, mwload): who connects, what is behind,
/// how requests are carried, what is measured, the process itself.
pub mod heading {
    /// Where clients connect, how many, TLS and logins.
    pub const CLIENTS: &str = "Clients";
    /// The servers behind (mwproxy's memcached, mwmq's database, mwload's targets).
    pub const SERVERS: &str = "Servers";
    /// The engine and the threads, queues and budgets that carry requests.
    pub const ENGINE: &str = "Engine";
    /// Results files, windows and the admin endpoint.
    pub const MEASUREMENT: &str = "Measurement";
    /// The configuration file, logging, and what to print instead of running.
    pub const PROCESS: &str = "Process";
}

use heading::{CLIENTS, ENGINE, MEASUREMENT, PROCESS};

/// The flags every middleware has.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ServerArgs {
    /// Address to listen on, host:port.
    #[arg(long, value_name = "ADDR", help_heading = CLIENTS)]
    pub listen: Option<String>,
    /// Client connections served at once; more are refused with the protocol's error.
    #[arg(long, value_name = "N", help_heading = CLIENTS)]
    pub max_connections: Option<usize>,
    /// Listener TLS: PEM certificate chain (with --tls-key, clients must speak TLS).
    #[arg(long, value_name = "FILE", help_heading = CLIENTS)]
    pub tls_cert: Option<String>,
    /// Listener TLS: PEM private key.
    #[arg(long, value_name = "FILE", help_heading = CLIENTS)]
    pub tls_key: Option<String>,
    /// Require client certificates signed by one of these PEM CA certificates.
    #[arg(long, value_name = "FILE", help_heading = CLIENTS)]
    pub tls_ca: Option<String>,
    /// A plaintext listener beside the TLS one, host:port (e.g. on loopback).
    #[arg(long, value_name = "ADDR", help_heading = CLIENTS)]
    pub plain_listen: Option<String>,
    /// Worker threads of the pool engine (the async engine's threads are --threads).
    #[arg(short = 't', long, value_name = "N", help_heading = ENGINE)]
    pub workers: Option<usize>,
    /// Requests that may wait for a worker (pool engine; the async engine has
    /// no queue); when full, clients are not read.
    #[arg(long, value_name = "N", help_heading = ENGINE)]
    pub queue_capacity: Option<usize>,
    /// Write windows.jsonl, summary.json and trace.csv into this directory.
    #[arg(long, value_name = "DIR", help_heading = MEASUREMENT)]
    pub out: Option<String>,
    /// Window length in ms; windows start at wall-clock multiples [default: 1000].
    #[arg(long, value_name = "MS", help_heading = MEASUREMENT)]
    pub window_ms: Option<u64>,
    /// Trace every k-th request into trace.csv, 0 = off [default: 100].
    #[arg(long, value_name = "K", help_heading = MEASUREMENT)]
    pub trace_every: Option<u64>,
    /// HTTP admin endpoint: host:port, or a port on 127.0.0.1 [default: off].
    #[arg(long, value_name = "ADDR", help_heading = MEASUREMENT)]
    pub admin: Option<String>,
    /// Name of this process in results files.
    #[arg(long, value_name = "NAME", help_heading = MEASUREMENT)]
    pub instance: Option<String>,
    /// TOML configuration file; flags given here override it.
    #[arg(short = 'c', long, value_name = "FILE", help_heading = PROCESS)]
    pub config: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long, help_heading = PROCESS)]
    pub print_config: bool,
    /// Log filter: error, warn, info, debug, trace, or a tracing filter [default: RUST_LOG, else info].
    #[arg(long, value_name = "FILTER", help_heading = PROCESS)]
    pub log: Option<String>,
    /// How log lines are written to standard error; colours only on a terminal [default: text].
    #[arg(long, value_enum, value_name = "FORMAT", help_heading = PROCESS)]
    pub log_format: Option<LogFormat>,
}

impl ServerArgs {
    /// The configuration file named by `--config`, or the defaults, with
    /// these flags applied.
    pub fn load<C: ServiceConfig>(&self) -> Result<C, ConfigError> {
        C::load(self.config.as_deref(), self.overlay::<C>())
    }

    /// These flags as settings in a configuration file's shape, to lay over one.
    pub fn overlay<C: ServiceConfig>(&self) -> toml::Table {
        let mut section = toml::Table::new();
        let put = |t: &mut toml::Table, k: &str, v: Option<toml::Value>| {
            if let Some(v) = v {
                t.insert(k.into(), v);
            }
        };
        let int = |n: Option<usize>| n.map(|n| toml::Value::Integer(n as i64));
        put(&mut section, "listen", self.listen.clone().map(toml::Value::String));
        put(&mut section, "workers", int(self.workers));
        put(&mut section, "queue_capacity", int(self.queue_capacity));
        put(&mut section, "max_connections", int(self.max_connections));
        let mut stats = toml::Table::new();
        put(&mut stats, "out", self.out.clone().map(toml::Value::String));
        put(&mut stats, "window_ms", self.window_ms.map(|n| toml::Value::Integer(n as i64)));
        put(&mut stats, "trace_every", self.trace_every.map(|n| toml::Value::Integer(n as i64)));
        put(&mut stats, "admin", self.admin.clone().map(toml::Value::String));
        put(&mut stats, "instance", self.instance.clone().map(toml::Value::String));
        let mut tls = toml::Table::new();
        put(&mut tls, "cert", self.tls_cert.clone().map(toml::Value::String));
        put(&mut tls, "key", self.tls_key.clone().map(toml::Value::String));
        put(&mut tls, "ca", self.tls_ca.clone().map(toml::Value::String));
        put(&mut tls, "plain_listen", self.plain_listen.clone().map(toml::Value::String));
        let mut overlay = toml::Table::new();
        for (name, t) in [(C::SECTION, section), ("stats", stats), ("tls", tls)] {
            if !t.is_empty() {
                overlay.insert(name.into(), toml::Value::Table(t));
            }
        }
        overlay
    }
}

/// Sets `field` when the flag was given.
pub fn set<T: Copy>(field: &mut T, flag: Option<T>) {
    if let Some(v) = flag {
        *field = v;
    }
}

/// The command line `P` of the middleware `S` as `--help`, man pages and
/// completions show it: the shared flags' help gains `S`'s defaults and
/// `--admin` the paths `S`'s endpoint serves.
pub fn command<P: Parser, S: Service>() -> clap::Command {
    let d = Common::of(&S::Config::default()).expect("the defaults are a configuration");
    let paths = S::ADMIN_PATHS.join(", ");
    let shown = [
        ("listen", format!(" [default: {}]", d.listen)),
        ("workers", format!(" [default: {}]", d.workers)),
        ("queue_capacity", format!(" [default: {}]", d.queue_capacity)),
        ("max_connections", format!(" [default: {}]", d.max_connections)),
        ("instance", format!(" [default: {}]", <S::Config as ServiceConfig>::INSTANCE)),
    ];
    let mut command = in_order(P::command());
    for (id, more) in shown {
        command = command.mut_arg(id, |a| {
            let help = a.get_help().map(ToString::to_string).unwrap_or_default();
            a.help(format!("{help}{more}"))
        });
    }
    command.mut_arg("admin", |a| {
        let help = a.get_help().map(ToString::to_string).unwrap_or_default();
        // "HTTP admin endpoint (/metrics, ...): host:port ..."
        a.help(help.replacen(':', &format!(" ({paths}):"), 1))
    })
}

/// `command` with the shared flags first under `Clients` (the listening
/// address before the flags that refine it) and after a program's own
/// elsewhere (`--engine` and `--threads` before `-t`).
fn in_order(command: clap::Command) -> clap::Command {
    let shared: Vec<String> = <ServerArgs as clap::Args>::augment_args(clap::Command::new("shared"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    let ids: Vec<String> = command.get_arguments().map(|a| a.get_id().to_string()).collect();
    ids.iter().fold(command, |command, id| {
        command.mut_arg(id, |a| {
            let order = a.get_display_order();
            match shared.iter().position(|s| s == id) {
                Some(i) if a.get_help_heading() == Some(heading::CLIENTS) => a.display_order(i),
                Some(i) => a.display_order(2_000 + i),
                None => a.display_order(1_000 + order),
            }
        })
    })
}

/// Parses the command line `P` of the middleware `S` ([`command`]).
pub fn parse<P: Parser, S: Service>() -> P {
    P::from_arg_matches(&command::<P, S>().get_matches()).unwrap_or_else(|e| e.exit())
}

/// A flag that one engine reads and the other does not, as given on a
/// command line: an operator who gives it to the other engine is told so
/// in one line at start ([`unread_flags`]), and the process goes on (seed
/// command lines carry `-t` whatever the engine).
#[derive(Clone, Debug)]
pub struct EngineFlag {
    /// How the user spells it, e.g. `-t/--workers`.
    pub flag: &'static str,
    /// The value given, if it was.
    pub given: Option<String>,
    /// The only engine that reads it.
    pub read_by: Engine,
    /// What to use with the other engine instead, and why.
    pub instead: &'static str,
}

/// One warning for each flag of `flags` given to an engine other than the
/// one that reads it: which flag, that `engine` ignores it, what to use.
pub fn unread_flags(engine: Engine, flags: &[EngineFlag]) -> Vec<String> {
    flags
        .iter()
        .filter(|f| f.read_by != engine)
        .filter_map(|f| {
            let value = f.given.as_ref()?;
            Some(format!("{} {value} is ignored by the {engine} engine: {}", f.flag, f.instead))
        })
        .collect()
}

/// A running middleware, as its `main` and its tests drive it.
pub trait Service: Sized {
    /// The program's name, for messages.
    const NAME: &'static str;
    /// The paths its admin endpoint serves (`--admin`'s help lists them).
    const ADMIN_PATHS: &'static [&'static str];
    /// Its configuration.
    type Config: ServiceConfig;
    /// Validates `config`, binds the listening address and starts the threads.
    fn start(config: Self::Config) -> Result<Self, StartError>;
    /// Its address, stats thread and admin endpoint.
    fn shell(&self) -> &Shell;
    /// The address clients connect to (useful with port 0).
    fn address(&self) -> &crate::stream::Addr {
        self.shell().addr()
    }
    /// The TCP address clients connect to; panics when it listens on a unix
    /// socket (see [`Service::address`]).
    fn local_addr(&self) -> std::net::SocketAddr {
        match self.address() {
            crate::stream::Addr::Tcp(a) => *a,
            crate::stream::Addr::Unix(p) => panic!("{} listens on the unix socket {}", Self::NAME, p.display()),
        }
    }
    /// The admin endpoint's address, when it is on.
    fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.shell().admin_addr()
    }
    /// What asks it to stop from another thread (a signal): no new
    /// connections, in-flight requests finish.
    fn stopper(&self) -> Stopper {
        self.shell().stopper()
    }
    /// Waits until every thread has finished (after a stop); the last
    /// window and summary.json are written by then.
    fn join(self);
    /// From now on a reload (SIGHUP, `POST /reload`) reads the configuration
    /// from `source`; what triggers one, or `None` when this middleware
    /// cannot reload.
    fn reloads(&self, _source: Source<Self::Config>) -> Option<Reload> {
        None
    }
}

/// A middleware's `main`: logging, the configuration read by `config` (exit
/// status 2 when it is refused), the warnings `notes` has about it (flags
/// its engine ignores), `--print-config`, start (exit status 1 when it
/// fails), reload on SIGHUP (`config` is read again), stop on SIGTERM or
/// SIGINT once in-flight requests are answered.
pub fn serve<S: Service>(
    args: &ServerArgs,
    config: impl Fn() -> Result<S::Config, ConfigError> + Send + Sync + 'static,
    notes: impl FnOnce(&S::Config) -> Vec<String>,
) -> ExitCode {
    init_logging(args.log.as_deref(), args.log_format.unwrap_or_default());
    let read = move || config().and_then(|c| c.validate().map(|_| c));
    let config = match read() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: {e}", S::NAME);
            return ExitCode::from(2);
        }
    };
    for note in notes(&config) {
        tracing::warn!("{note}");
    }
    if args.print_config {
        // Secrets masked: a configuration printed is one shown to others.
        print!("{}", config.redacted().to_toml());
        return ExitCode::SUCCESS;
    }
    let signals = match catch_signals() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}: cannot install signal handlers: {e}", S::NAME);
            return ExitCode::from(1);
        }
    };
    let service = match S::start(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}: {e}", S::NAME);
            return ExitCode::from(1);
        }
    };
    let stopper = service.stopper();
    let reload = service.reloads(std::sync::Arc::new(move || read().map_err(|e| e.to_string())));
    if let Err(e) = signals.serve(Box::new(move || stopper.stop()), reload) {
        eprintln!("{}: cannot install signal handlers: {e}", S::NAME);
        return ExitCode::from(1);
    }
    service.join();
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StatsConfig;

    #[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct TestConfig {
        server: Section,
        stats: StatsConfig,
    }

    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Section {
        listen: String,
        workers: usize,
        queue_capacity: usize,
        max_connections: usize,
    }

    impl Default for Section {
        fn default() -> Self {
            Section { listen: "127.0.0.1:1".into(), workers: 8, queue_capacity: 16, max_connections: 32 }
        }
    }

    impl ServiceConfig for TestConfig {
        const INSTANCE: &'static str = "t0";
        const SECTION: &'static str = "server";
        fn check(&self) -> Result<(), ConfigError> {
            Ok(())
        }
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        server: ServerArgs,
    }

    #[test]
    fn flags_override_the_file_and_unknown_keys_are_refused() {
        let dir = std::env::temp_dir().join(format!("mwserve-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(&path, "[server]\nworkers = 3\nqueue_capacity = 4\n[stats]\nwindow_ms = 500\n").unwrap();
        let p = path.to_str().unwrap();
        let args = ["x", "-c", p, "-t", "5", "--listen", "0.0.0.0:9", "--out", "/tmp/r", "--instance", "a"];
        let c: TestConfig = Cli::parse_from(args).server.load().unwrap();
        let s = &c.server;
        assert_eq!((s.workers, s.queue_capacity, s.max_connections), (5, 4, 32));
        assert_eq!((s.listen.as_str(), c.stats.window_ms, c.stats.out.as_deref()), ("0.0.0.0:9", 500, Some("/tmp/r")));
        assert_eq!(c.stats.instance_or(TestConfig::INSTANCE), "a");
        std::fs::write(&path, "[server]\nworker = 3\n").unwrap();
        let e = Cli::parse_from(["x", "-c", p]).server.load::<TestConfig>().unwrap_err();
        assert!(e.0.contains("unknown field `worker`"), "{e}");
        let e = Cli::parse_from(["x", "-c", "/nonexistent.toml"]).server.load::<TestConfig>().unwrap_err();
        assert!(e.0.contains("cannot read /nonexistent.toml"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_flag_is_named_only_when_given_to_the_engine_that_does_not_read_it() {
        let flag = |given: Option<&str>| EngineFlag {
            flag: "-t/--workers",
            given: given.map(str::to_string),
            read_by: Engine::Pool,
            instead: "use --threads",
        };
        assert!(unread_flags(Engine::Pool, &[flag(Some("4"))]).is_empty(), "read by its engine");
        assert!(unread_flags(Engine::Async, &[flag(None)]).is_empty(), "not given");
        let notes = unread_flags(Engine::Async, &[flag(Some("4"))]);
        assert_eq!(notes, ["-t/--workers 4 is ignored by the async engine: use --threads"]);
    }

    #[test]
    fn the_common_settings_are_checked() {
        assert!(TestConfig::default().validate().is_ok());
        let with = |f: fn(&mut Section)| {
            let mut c = TestConfig::default();
            f(&mut c.server);
            c.validate().unwrap_err().0
        };
        assert!(with(|s| s.workers = 0).contains("workers"));
        assert!(with(|s| s.listen = "nowhere".into()).contains("listen address"));
        assert!(with(|s| s.max_connections = 0).contains("max_connections"));
        let c = TestConfig { stats: StatsConfig { window_ms: 1, ..StatsConfig::default() }, ..TestConfig::default() };
        assert!(c.validate().unwrap_err().0.contains("window_ms"));
    }
}
