//! The command line: the settings people change most as flags, the rest in
//! a TOML file (`--config`); flags override the file.

use clap::Parser;
use mwserve::cli::{set, ServerArgs};
use mwserve::process::parse_size;

use crate::config::{Config, ConfigError};

/// mwmq: a message queue over PostgreSQL that any Redis client can talk to.
#[derive(Parser, Debug, Default)]
#[command(name = "mwmq", version, about, long_about = None)]
pub struct Cli {
    /// The flags every middleware has (config file, listen address, results, admin, logs).
    #[command(flatten)]
    pub server: ServerArgs,
    /// PostgreSQL connection string, e.g. 'host=/run/postgresql dbname=mwmq user=mwmq'.
    #[arg(long, value_name = "CONNINFO")]
    pub db: Option<String>,
    /// Database connections in the pool [default: one per worker].
    #[arg(long, value_name = "N")]
    pub db_pool: Option<usize>,
    /// Most SENDs, ACKs or POPs a worker runs as one statement, 1 = one request at a time [default: 1].
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
    /// Largest message body (any argument) in bytes; k and m suffixes [default: 4m].
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub max_body: Option<usize>,
}

impl Cli {
    /// The configuration: the file (if any), then every flag given.
    pub fn to_config(&self) -> Result<Config, ConfigError> {
        let mut c: Config = self.server.load()?;
        if let Some(db) = &self.db {
            c.database.url = db.clone();
        }
        set(&mut c.database.pool, self.db_pool);
        set(&mut c.server.batch, self.batch);
        set(&mut c.server.max_body, self.max_body);
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
    fn database_flags() {
        let cli = Cli::parse_from(["mwmq", "--db", "host=/tmp", "--db-pool", "5", "--max-body", "1m", "-t", "3"]);
        let c = cli.to_config().unwrap();
        assert_eq!((c.server.workers, c.database.pool, c.server.max_body), (3, 5, 1 << 20));
        assert_eq!(c.database.url, "host=/tmp");
        assert!(Cli::try_parse_from(["mwmq", "--max-body", "lots"]).is_err());
    }
}
