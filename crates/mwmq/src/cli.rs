//! The command line: the settings people change most as flags, the rest in
//! a TOML file (`--config`); flags override the file.

use std::path::PathBuf;

use clap::Parser;
use mwserve::process::parse_size;

use crate::config::{Config, ConfigError};

/// mwmq: a message queue over PostgreSQL that any Redis client can talk to.
#[derive(Parser, Debug, Default)]
#[command(name = "mwmq", version, about, long_about = None)]
pub struct Cli {
    /// TOML configuration file; flags given here override it.
    #[arg(short = 'c', long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on, host:port [default: 127.0.0.1:6380].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// PostgreSQL connection string, e.g. 'host=/run/postgresql dbname=mwmq user=mwmq'.
    #[arg(long, value_name = "CONNINFO")]
    pub db: Option<String>,
    /// Worker threads [default: 8].
    #[arg(short = 't', long, value_name = "N")]
    pub workers: Option<usize>,
    /// Database connections in the pool [default: one per worker].
    #[arg(long, value_name = "N")]
    pub db_pool: Option<usize>,
    /// Most SENDs, ACKs or POPs a worker runs as one statement, 1 = one request at a time [default: 1].
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
    /// Request queue capacity; when full, clients are not read [default: 1024].
    #[arg(long, value_name = "N")]
    pub queue_capacity: Option<usize>,
    /// Client connections served at once [default: 10000].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Largest message body (any argument) in bytes; k and m suffixes [default: 4m].
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub max_body: Option<usize>,
    /// Write windows.jsonl, summary.json and trace.csv into this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<String>,
    /// Window length in ms [default: 1000].
    #[arg(long, value_name = "MS")]
    pub window_ms: Option<u64>,
    /// Trace every k-th request into trace.csv, 0 = off [default: 100].
    #[arg(long, value_name = "K")]
    pub trace_every: Option<u64>,
    /// HTTP admin endpoint (/metrics, /stats, /healthz): host:port or a port on 127.0.0.1.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// Name of this process in results files [default: mq0].
    #[arg(long, value_name = "NAME")]
    pub instance: Option<String>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Log filter (error, warn, info, debug, trace) [default: info, or RUST_LOG].
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
}

impl Cli {
    /// The configuration: the file (if any), then every flag given.
    pub fn to_config(&self) -> Result<Config, ConfigError> {
        let mut c = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
                Config::from_toml(&text)?
            }
            None => Config::default(),
        };
        macro_rules! set {
            ($flag:expr, $field:expr) => {
                if let Some(v) = $flag.clone() {
                    $field = v;
                }
            };
        }
        set!(self.listen, c.server.listen);
        set!(self.db, c.database.url);
        set!(self.workers, c.server.workers);
        set!(self.db_pool, c.database.pool);
        set!(self.queue_capacity, c.server.queue_capacity);
        set!(self.batch, c.server.batch);
        set!(self.max_connections, c.server.max_connections);
        set!(self.max_body, c.server.max_body);
        set!(self.window_ms, c.stats.window_ms);
        set!(self.trace_every, c.stats.trace_every);
        set!(self.instance, c.stats.instance);
        if self.out.is_some() {
            c.stats.out = self.out.clone();
        }
        if self.admin.is_some() {
            c.stats.admin = self.admin.clone();
        }
        if c.server.input_budget < c.server.max_body {
            c.server.input_budget = c.server.max_body;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file() {
        let dir = std::env::temp_dir().join(format!("mwmq-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("mq.toml");
        std::fs::write(&file, "[server]\nworkers = 3\n[database]\nurl = \"host=/tmp\"\n").unwrap();
        let cli = Cli::parse_from(["mwmq", "-c", file.to_str().unwrap(), "--db-pool", "5", "--max-body", "1m"]);
        let c = cli.to_config().unwrap();
        assert_eq!((c.server.workers, c.database.pool, c.server.max_body), (3, 5, 1 << 20));
        assert_eq!(c.database.url, "host=/tmp");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
