//! File descriptors: how many clients fit.
//!
//! At start the soft limit on open files is raised to the hard limit. Each
//! worker (and the health checker) needs a connection to every server, and the proxy needs a few
//! descriptors of its own (listener, event loops, results files, admin
//! endpoint); what is left is for clients. When `max_connections` does not
//! fit, the proxy says so at start and serves as many clients as fit, so that
//! a client over the limit is refused with memcached's message and the
//! connections to the servers can always be opened again.

pub use mwserve::fdlimit::FdPlan;

use crate::config::Config;

/// Raises the soft limit to the hard one and works out how many clients fit.
pub fn raise_and_plan(config: &Config) -> Result<FdPlan, String> {
    plan(config, mwserve::fdlimit::raise_soft_limit())
}

/// How many clients fit under a limit of `limit` open files: each worker
/// (or async loop) and the health checker need a connection to every
/// server, each event loop two descriptors.
pub fn plan(config: &Config, limit: u64) -> Result<FdPlan, String> {
    let p = &config.proxy;
    let (carriers, loops, who) = match p.engine {
        crate::config::Engine::Pool => (p.workers, p.net_threads, "workers"),
        crate::config::Engine::Async => (p.loops(), p.loops(), "loops"),
    };
    // (+1: the health checker; with a route tree, +1 more: its side thread.)
    let others = 1 + usize::from(config.has_routes());
    let backends = ((carriers + others) * config.effective_routing().servers.len()) as u64;
    let own = backends + 2 * loops as u64;
    let what = format!(
        "{carriers} {who} and the health checker x {} servers (and the event loops)",
        config.effective_routing().servers.len()
    );
    mwserve::fdlimit::plan(limit, own, &what, config.proxy.max_connections)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_get_what_is_left_after_the_reserve() {
        let mut c = Config::default();
        c.routing.servers = vec!["127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap()];
        c.proxy.engine = crate::config::Engine::Pool;
        c.proxy.workers = 8;
        let p = plan(&c, 1024).unwrap();
        assert_eq!(p.reserve, 18 + 2 + mwserve::fdlimit::OWN);
        assert_eq!(p.max_connections, 1024 - 18 - 2 - mwserve::fdlimit::OWN as usize);
        let p = plan(&c, 100_000).unwrap();
        assert_eq!(p.max_connections, c.proxy.max_connections);
        let e = plan(&c, 50).unwrap_err();
        assert!(e.contains("ulimit"), "{e}");
    }
}
