//! File descriptors: how many clients fit.
//!
//! At start the soft limit on open files is raised to the hard limit. Each
//! worker needs a connection to every server, and the proxy needs a few
//! descriptors of its own (listener, event loops, results files, admin
//! endpoint); what is left is for clients. When `max_connections` does not
//! fit, the proxy says so at start and serves as many clients as fit, so that
//! a client over the limit is refused with memcached's message and the
//! connections to the servers can always be opened again.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

use crate::config::Config;

/// Descriptors kept for the proxy itself besides backend connections.
const OWN: u64 = 64;
/// Used when the hard limit is unlimited.
const UNLIMITED: u64 = 1 << 20;

/// The client limit that fits, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdPlan {
    /// The soft limit on open files after raising it.
    pub limit: u64,
    /// Descriptors kept for server connections and the proxy itself.
    pub reserve: u64,
    /// Clients served at once.
    pub max_connections: usize,
}

/// Raises the soft limit to the hard one and works out how many clients fit.
pub fn raise_and_plan(config: &Config) -> Result<FdPlan, String> {
    let lim = getrlimit(Resource::Nofile);
    let hard = lim.maximum.unwrap_or(UNLIMITED);
    let mut soft = lim.current.unwrap_or(hard);
    if soft < hard {
        let target = hard.min(UNLIMITED);
        match setrlimit(Resource::Nofile, Rlimit { current: Some(target), maximum: lim.maximum }) {
            Ok(()) => soft = target,
            Err(e) => tracing::warn!("cannot raise the open file limit from {soft} to {target}: {e}"),
        }
    }
    plan(config, soft)
}

/// How many clients fit under a limit of `limit` open files.
pub fn plan(config: &Config, limit: u64) -> Result<FdPlan, String> {
    let backends = (config.proxy.workers * config.routing.servers.len()) as u64;
    let reserve = backends + 2 * config.proxy.net_threads as u64 + OWN;
    let usable = limit.saturating_sub(reserve);
    if usable == 0 {
        return Err(format!(
            "the open file limit ({limit}) leaves no room for clients: {} workers x {} servers need {backends} \
             connections, plus {} for the proxy itself; raise it with `ulimit -n` or use fewer workers",
            config.proxy.workers,
            config.routing.servers.len(),
            reserve - backends
        ));
    }
    let max_connections = config.proxy.max_connections.min(usize::try_from(usable).unwrap_or(usize::MAX));
    Ok(FdPlan { limit, reserve, max_connections })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_get_what_is_left_after_the_reserve() {
        let mut c = Config::default();
        c.routing.servers = vec!["127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap()];
        c.proxy.workers = 8;
        let p = plan(&c, 1024).unwrap();
        assert_eq!(p.reserve, 16 + 2 + OWN);
        assert_eq!(p.max_connections, 1024 - 16 - 2 - OWN as usize);
        let p = plan(&c, 100_000).unwrap();
        assert_eq!(p.max_connections, c.proxy.max_connections);
        let e = plan(&c, 50).unwrap_err();
        assert!(e.contains("ulimit"), "{e}");
    }
}
