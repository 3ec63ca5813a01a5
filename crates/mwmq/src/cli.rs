//! The command line: the settings people change most as flags, the rest in
//! a TOML file (`--config`); flags override the file.

use clap::Parser;
use mwserve::cli::heading::{CLIENTS, ENGINE, SERVERS};
use mwserve::cli::{set, EngineFlag, ServerArgs};
use mwserve::process::parse_size;

use crate::config::{Config, ConfigError, ServiceConfig};
use mwserve::config::Engine;

/// mwmq: a message queue over PostgreSQL that any Redis client can talk to.
#[derive(Parser, Debug, Default)]
#[command(name = "mwmq", version, about, long_about = None, after_long_help = AFTER_HELP)]
pub struct Cli {
    /// Listen beyond loopback without [[users]]: anyone who reaches the port may use every queue.
    #[arg(long, help_heading = CLIENTS)]
    pub insecure_no_auth: bool,
    /// Accept a configuration file with secrets that every user of this machine may read (refused otherwise).
    #[arg(long, help_heading = CLIENTS)]
    pub allow_readable_secrets: bool,
    /// Largest message body (any argument) in bytes; k and m suffixes [default: 4m].
    #[arg(long, value_name = "BYTES", value_parser = parse_size, help_heading = CLIENTS)]
    pub max_body: Option<usize>,
    /// PostgreSQL connection string, e.g. 'host=/run/postgresql dbname=mwmq user=mwmq'.
    #[arg(long, value_name = "CONNINFO", help_heading = SERVERS)]
    pub db: Option<String>,
    /// Database connections in the pool: the pool engine's workers borrow them, the async engine
    /// uses them for the shared poll of waiting requests and /ui [default: -t/--workers].
    #[arg(long, value_name = "N", help_heading = SERVERS)]
    pub db_pool: Option<usize>,
    /// How requests are carried out: async (event loops with pipelined
    /// database connections) or pool (net thread, queue, workers, pool: the
    /// seed reports' architecture) [default: async].
    #[arg(long, value_enum, help_heading = ENGINE)]
    pub engine: Option<mwserve::config::Engine>,
    /// Event loops of the async engine, 0 = half the cores, at least one (the pool engine's
    /// threads are -t/--workers) [default: 0].
    #[arg(long, value_name = "N", help_heading = ENGINE)]
    pub threads: Option<usize>,
    /// Most requests of one kind carried out together, by a worker or a loop (SEND without KEY, ACK, POP, RECV of one message without WAIT, XADD with *, XACK, XREADGROUP of new entries without BLOCK); 1 = one request at a time [default: 32].
    #[arg(long, value_name = "N", help_heading = ENGINE)]
    pub batch: Option<usize>,
    /// The flags every middleware has (listen address, TLS, results, admin, config file, logs).
    #[command(flatten)]
    pub server: ServerArgs,
    /// `mwmq user add ...`: make a user entry for the configuration file;
    /// `mwmq rebalance`: move queues to the databases placement names.
    #[command(subcommand)]
    pub command: Option<Sub>,
}

/// `--help`'s last words: where the queue commands are, signals and exit statuses.
const AFTER_HELP: &str = "\
Clients send the queue commands over RESP (redis-cli -p 6380 SEND jobs hello PRIORITY 7; QCREATE, RECV, ACK, \
QALTER q BACKOFF, QSCHEDULE, ...): man mwmq lists them under COMMANDS.
Signals: SIGTERM or SIGINT stop it once requests received are answered.
Exit status: 0 stopped by a signal, 1 could not start (the database unreachable, the port taken, ...), \
2 the flags or the configuration were refused.";

/// mwmq's tools besides serving.
#[derive(clap::Subcommand, Debug)]
pub enum Sub {
    /// Users of the configuration file.
    #[command(subcommand)]
    User(UserSub),
    /// Move each queue that is not on the database placement names for it
    /// (after a database was added to [[databases]]) there, while mwmq serves it.
    Rebalance {
        /// Only say which queues would move.
        #[arg(long)]
        dry_run: bool,
        /// Wait this long between creating a queue on its new database and
        /// draining the old one (every mwmq looks for moved queues each second).
        #[arg(long, value_name = "MS", default_value_t = 3000)]
        settle_ms: u64,
        /// The configuration file with the [[databases]] list (as `mwmq --config FILE rebalance`).
        #[arg(long, value_name = "FILE")]
        config: Option<std::path::PathBuf>,
    },
}

/// `mwmq user ...`
#[derive(clap::Subcommand, Debug)]
pub enum UserSub {
    /// Print a [[users]] table (name, argon2 password hash, rights) to append to the configuration file.
    Add {
        /// The user's name: its identity as sender and receiver.
        name: String,
        /// Read the password from standard input (its first line), so that it is in no shell history.
        #[arg(long, required = true)]
        password_stdin: bool,
        /// Queues it may send to (a pattern; `*` matches any characters); repeat for more.
        #[arg(long, value_name = "PATTERN")]
        send: Vec<String>,
        /// Queues it may receive from (RECV, POP, PEEK, ACK, NACK, TOUCH).
        #[arg(long, value_name = "PATTERN")]
        receive: Vec<String>,
        /// Queues it may administer: QCREATE, QALTER, QDROP, QPAUSE, QRESUME, QARCHIVE, QDEAD, REDRIVE, QSCHEDULE.
        #[arg(long, value_name = "PATTERN")]
        admin: Vec<String>,
    },
}

impl Sub {
    /// Runs the tool: what it prints, or why it cannot.
    pub fn run(&self, cli: &Cli, stdin: &mut impl std::io::BufRead) -> Result<String, String> {
        let (name, send, receive, admin) = match self {
            Sub::User(UserSub::Add { name, password_stdin: _, send, receive, admin }) => (name, send, receive, admin),
            Sub::Rebalance { dry_run, settle_ms, config } => {
                let mut server = cli.server.clone();
                if let Some(file) = config {
                    server.config = Some(file.clone());
                }
                let cfg = Cli { server, db: cli.db.clone(), ..Cli::default() }.to_config().map_err(|e| e.0)?;
                cfg.validate().and_then(|_| cfg.require_database()).map_err(|e| e.0)?;
                return crate::rebalance::run(&cfg, *dry_run, std::time::Duration::from_millis(*settle_ms));
            }
        };
        let mut line = String::new();
        stdin.read_line(&mut line).map_err(|e| format!("cannot read the password: {e}"))?;
        let password = line.trim_end_matches(['\r', '\n']);
        if password.is_empty() {
            return Err("no password on standard input (give it as the first line)".into());
        }
        crate::users::user_table(name, password.as_bytes(), send, receive, admin)
    }
}

impl Cli {
    /// The flags given that only one engine reads, for
    /// [`mwserve::cli::unread_flags`]: the pool engine's workers and queue,
    /// the async engine's loops.
    pub fn engine_flags(&self) -> Vec<EngineFlag> {
        let shown = |n: Option<usize>| n.map(|n| n.to_string());
        vec![
            EngineFlag {
                flag: "-t/--workers",
                given: shown(self.server.workers),
                read_by: Engine::Pool,
                instead: "its event loops are --threads (0 = half the cores); -t only sets --db-pool's default \
                          there, or choose --engine pool",
            },
            EngineFlag {
                flag: "--queue-capacity",
                given: shown(self.server.queue_capacity),
                read_by: Engine::Pool,
                instead: "it has no request queue",
            },
            EngineFlag {
                flag: "--threads",
                given: shown(self.threads),
                read_by: Engine::Async,
                instead: "its worker threads are -t/--workers",
            },
        ]
    }

    /// The configuration: the file (if any), then every flag given; one
    /// without a database is refused unless it is only printed
    /// (`--print-config`).
    pub fn to_config(&self) -> Result<Config, ConfigError> {
        let mut c: Config = self.server.load()?;
        // (What the file holds, before --db.)
        let file_has_secrets = c.has_secrets();
        if let Some(db) = &self.db {
            c.database.url = db.clone();
        }
        set(&mut c.server.engine, self.engine);
        set(&mut c.server.threads, self.threads);
        set(&mut c.database.pool, self.db_pool);
        set(&mut c.server.batch, self.batch);
        set(&mut c.server.max_body, self.max_body);
        if self.insecure_no_auth {
            c.server.insecure_no_auth = true;
        }
        if c.server.input_budget < c.server.max_body {
            c.server.input_budget = c.server.max_body;
        }
        // (A larger --max-body than the reply bound: one entry must still fit a reply.)
        c.server.max_reply_bytes = c.server.max_reply_bytes.max(c.server.max_body);
        if self.allow_readable_secrets {
            c.server.allow_readable_secrets = true;
        }
        if let Some(file) = &self.server.config {
            if file_has_secrets && !c.server.allow_readable_secrets {
                mwserve::config::check_private(file, "configuration file", "--allow-readable-secrets")
                    .map_err(ConfigError)?;
            }
        }
        if !self.server.print_config {
            c.require_database()?;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_flags() {
        let cli = Cli::parse_from(["mwmq", "--db", "host=/tmp", "--db-pool", "5", "--max-body", "1m", "-t", "3"]);
        let c = cli.to_config().unwrap();
        assert_eq!((c.server.workers, c.database.pool, c.server.max_body), (3, 5, 1 << 20));
        assert_eq!(c.database.url, "host=/tmp");
        assert!(Cli::try_parse_from(["mwmq", "--max-body", "lots"]).is_err());
    }
}
