//! Why a middleware could not start, for every middleware alike.

use crate::config::ConfigError;

/// Why a middleware could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration was refused.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The listening socket (or the admin endpoint's) could not be set up.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The results directory could not be created.
    #[error("cannot write results into {0:?}: {1}")]
    Results(String, std::io::Error),
    /// The process may not open enough files.
    #[error("{0}")]
    Descriptors(String),
    /// Something the middleware needs is not there (mwmq: the database).
    #[error("{what}: {why}")]
    Dependency {
        /// What (`database`).
        what: &'static str,
        /// Why.
        why: String,
    },
    /// Another set-up step failed.
    #[error("start-up failed: {0}")]
    Io(#[from] std::io::Error),
}
