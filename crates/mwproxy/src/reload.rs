//! Reloading the configuration without a restart (SIGHUP, `POST /reload`).
//!
//! The file is read again (with the command line's flags over it, as at
//! start) and checked as at start; the certificates, keys and users files it
//! names are read. If anything is wrong the running configuration stays,
//! the reason is logged and counted (`config_reload_failures`) and returned.
//! Otherwise the servers are numbered (a server already known — same
//! address, same TLS name — keeps its number, its connections, health and
//! repairs), the timeouts and the servers' login and TLS settings take
//! effect for what comes next, and the new [`Generation`] is swapped in at
//! once: requests already routed finish with the one they started with,
//! every new one takes the new ring. Client connections are not touched;
//! carriers close their connections to removed servers once nothing is in
//! flight on them.
//!
//! What cannot change while running (the listening sockets, the engine and
//! its threads, the queue and memory budgets, the measurement outputs, TLS
//! on or off on the listener) keeps its running value; the report names each
//! such setting that the file changed, so nothing is silently ignored.

use std::fmt;

use mwserve::config::ServiceConfig;

use crate::config::Config;
use crate::credentials::Credentials;
use crate::generation::Generation;
use crate::shared::Shared;
use crate::stats::bump;

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// The generation now in use.
    pub generation: u64,
    /// Servers added, as `host:port`.
    pub added: Vec<String>,
    /// Servers removed.
    pub removed: Vec<String>,
    /// Servers in both configurations.
    pub kept: usize,
    /// Settings the file changed that only a restart changes (`section.key`).
    pub not_applied: Vec<String>,
    /// The route tree now in use, in a few words (none without `[route]`).
    pub route: Option<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "configuration {} in use: {} servers kept, {} added, {} removed",
            self.generation,
            self.kept,
            self.added.len(),
            self.removed.len()
        )?;
        if let Some(route) = &self.route {
            write!(f, "; {route}")?;
        }
        for (what, list) in [("added", &self.added), ("removed", &self.removed)] {
            if !list.is_empty() {
                write!(f, "; {what} {}", list.join(", "))?;
            }
        }
        if !self.not_applied.is_empty() {
            write!(f, "; not applied until a restart: {}", self.not_applied.join(", "))?;
        }
        Ok(())
    }
}

/// Settings a running proxy cannot change, as `section.key` (every key of
/// `stats`, and whether the listener speaks TLS, besides these).
const FIXED: &[&str] = &[
    "proxy.listen",
    "proxy.engine",
    "proxy.threads",
    "proxy.workers",
    "proxy.net_threads",
    "proxy.queue_capacity",
    "proxy.max_connections",
    "proxy.max_pending_output",
    "proxy.max_pending_input",
    "proxy.memory_budget",
    "proxy.shutdown_grace_secs",
    "tls.plain_listen",
];

/// Puts `read` (the file read again, or why it could not be) in use, or
/// keeps the running configuration and says why.
pub fn reload(shared: &Shared, read: Result<Config, String>) -> Result<Report, String> {
    let outcome = read.and_then(|next| apply(shared, next));
    match &outcome {
        Ok(report) => {
            bump(&shared.net.config_reloads);
            tracing::info!("reloaded: {report}");
            if !report.not_applied.is_empty() {
                tracing::warn!(
                    "these settings changed in the file but only change with a restart: {}",
                    report.not_applied.join(", ")
                );
            }
        }
        Err(why) => {
            bump(&shared.net.config_reload_failures);
            tracing::error!("reload refused, the running configuration stays: {why}");
        }
    }
    outcome
}

fn apply(shared: &Shared, mut next: Config) -> Result<Report, String> {
    let running = shared.generation();
    let not_applied = keep_fixed(&shared.config, &mut next);
    next.validate().map_err(|e| e.to_string())?;
    let addrs = next.effective_routing().servers.iter().map(crate::config::resolve).collect::<Result<Vec<_>, _>>();
    let addrs = addrs.map_err(|e| e.to_string())?;
    let creds = Credentials::load(&next).map_err(|e| e.to_string())?;
    if creds.tls.is_none() != running.tls.is_none() {
        return Err("TLS on the listener can only be turned on or off with a restart".into());
    }
    let ids = shared.servers.register(&creds.endpoints(&addrs))?;
    let name = |&s: &usize| shared.servers.addr(s).to_string();
    let added = ids.iter().filter(|s| !running.uses(**s)).map(name).collect();
    let removed = running.ids.iter().filter(|s| !ids.contains(s)).map(name).collect();
    let kept = ids.iter().filter(|s| running.uses(**s)).count();
    shared.servers.configure(&next.backend);
    shared.servers.set_login(creds.login);
    shared.servers.set_tls(creds.server_tls.map(|(cfg, _)| cfg));
    let id = running.id + 1;
    let generation = Generation::new(id, next, &addrs, ids, creds.users, creds.tls)
        .ejecting(shared.servers.health.ejection.clone())
        .routed(&shared.side, shared.servers.health.ejection.clone(), Some(&running));
    let route = generation.tree.as_ref().map(|t| t.summary());
    shared.install(generation);
    // The users file may give a user another password: a password that
    // failed before the reload is checked again, not refused as a repeat.
    shared.logins.forget_failures();
    Ok(Report { generation: id, added, removed, kept, not_applied, route })
}

/// Gives `next` the running values of what cannot change, and names the
/// settings whose values differed.
fn keep_fixed(start: &Config, next: &mut Config) -> Vec<String> {
    let table = |c: &Config| toml::Table::try_from(c).unwrap_or_default();
    let (old, new) = (table(start), table(next));
    let value = |t: &toml::Table, path: &str| {
        let (section, key) = path.split_once('.').expect("section.key");
        t.get(section).and_then(|s| s.get(key)).cloned()
    };
    let mut changed: Vec<String> =
        FIXED.iter().filter(|p| value(&old, p) != value(&new, p)).map(|p| p.to_string()).collect();
    let stats_keys = |t: &toml::Table| -> Vec<String> {
        t.get("stats").and_then(toml::Value::as_table).map(|s| s.keys().cloned().collect()).unwrap_or_default()
    };
    let mut keys = stats_keys(&old);
    keys.extend(stats_keys(&new));
    keys.sort();
    keys.dedup();
    changed.extend(keys.iter().map(|k| format!("stats.{k}")).filter(|p| value(&old, p) != value(&new, p)));
    next.proxy = start.proxy.clone();
    next.stats = start.stats.clone();
    next.tls.plain_listen = start.tls.plain_listen.clone();
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_settings_keep_their_running_values_and_are_named() {
        let start = Config::default();
        let mut next = Config::default();
        next.proxy.listen = "127.0.0.1:1".into();
        next.proxy.workers = 3;
        next.stats.window_ms = 250;
        next.backend.timeout_ms = 99;
        let changed = keep_fixed(&start, &mut next);
        assert_eq!(changed, ["proxy.listen", "proxy.workers", "stats.window_ms"]);
        assert_eq!(next.proxy, start.proxy);
        assert_eq!(next.stats, start.stats);
        assert_eq!(next.backend.timeout_ms, 99, "what may change, changes");
        assert!(keep_fixed(&start, &mut Config::default()).is_empty());
    }
}
