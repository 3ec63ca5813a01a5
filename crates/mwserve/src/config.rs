//! What every middleware's configuration has in common: loading a TOML file
//! that refuses unknown keys, the error that says what to change, and the
//! `[stats]` section (measurement outputs and the admin endpoint).

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A configuration a middleware refuses, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// A middleware's configuration: TOML in and out, the settings every
/// middleware has, and a check of every setting.
///
/// The settings every middleware has — `listen`, `workers`,
/// `queue_capacity`, `max_connections` in the section [`ServiceConfig::SECTION`],
/// and the `[stats]` section — are read and set through the configuration's
/// TOML form, so the shared flags and checks need nothing else from it.
pub trait ServiceConfig: Serialize + DeserializeOwned + Default + Clone {
    /// The process's name in results files unless `[stats] instance` says otherwise.
    const INSTANCE: &'static str;
    /// The section that holds the settings every middleware has (`proxy`, `server`).
    const SECTION: &'static str;

    /// Checks the middleware's own settings (the common ones are checked by
    /// [`ServiceConfig::validate`]); the message says what to change.
    fn check(&self) -> Result<(), ConfigError>;

    /// Checks every setting; the message says what to change.
    fn validate(&self) -> Result<(), ConfigError> {
        Common::of(self)?.check()?;
        self.check()
    }

    /// Reads TOML text; unknown keys are an error.
    fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError(format!("config file: {e}")))
    }

    /// The file at `path` (or the defaults when there is none) with
    /// `overlay` (settings from flags, in the file's shape) on top.
    fn load(path: Option<&Path>, overlay: toml::Table) -> Result<Self, ConfigError> {
        let doc = match path {
            Some(p) => std::fs::read_to_string(p)
                .map_err(|e| ConfigError(format!("cannot read {}: {e}", p.display())))?
                .parse::<toml::Table>()
                .map_err(|e| ConfigError(format!("config file: {e}")))?,
            None => toml::Table::new(),
        };
        Self::from_table(doc, overlay)
    }

    /// Settings in a configuration file's shape (`doc`, read from another
    /// format) with `overlay` on top.
    fn from_table(mut doc: toml::Table, overlay: toml::Table) -> Result<Self, ConfigError> {
        merge(&mut doc, overlay);
        Self::deserialize(doc).map_err(|e| ConfigError(format!("config file: {e}")))
    }

    /// The configuration as TOML.
    fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serializes")
    }

    /// Masks the secrets it holds (passwords, password hashes), for
    /// `--print-config` and the results' metadata.
    fn redact(&mut self) {}

    /// A copy with its secrets masked ([`ServiceConfig::redact`]).
    fn redacted(&self) -> Self {
        let mut shown = self.clone();
        shown.redact();
        shown
    }
}

/// Refuses a file holding secrets (passwords, password hashes) that every
/// user of the machine may read, as PostgreSQL refuses such a key file; the
/// message says how to fix it, or how to accept it (`flag`).
pub fn check_private(path: &Path, what: &str, flag: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).map_err(|e| format!("{what} {}: {e}", path.display()))?.permissions().mode();
    if mode & 0o007 != 0 {
        return Err(format!(
            "{what} {} holds secrets and every user of this machine may read it (mode {:o}): `chmod 600 {}`, \
             or accept it with {flag}",
            path.display(),
            mode & 0o777,
            path.display()
        ));
    }
    Ok(())
}

/// Puts `overlay`'s values into `doc`, section by section.
fn merge(doc: &mut toml::Table, overlay: toml::Table) {
    for (k, v) in overlay {
        match (doc.get_mut(&k), v) {
            (Some(toml::Value::Table(d)), toml::Value::Table(o)) => merge(d, o),
            (_, v) => {
                doc.insert(k, v);
            }
        }
    }
}

/// The settings every middleware has, as its configuration holds them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Common {
    /// Address clients connect to.
    pub listen: String,
    /// Worker threads.
    pub workers: usize,
    /// Requests (or connections with requests) that may wait for a worker.
    pub queue_capacity: usize,
    /// Client connections served at once.
    pub max_connections: usize,
    /// Measurement outputs and the admin endpoint.
    #[serde(skip)]
    pub stats: StatsConfig,
}

impl Common {
    /// The common settings of `config`.
    pub fn of<C: ServiceConfig>(config: &C) -> Result<Common, ConfigError> {
        let bad = |e: &dyn std::fmt::Display| ConfigError(format!("configuration: {e}"));
        let doc = toml::Table::try_from(config).map_err(|e| bad(&e))?;
        let section = doc.get(C::SECTION).cloned().unwrap_or(toml::Value::Table(toml::Table::new()));
        let mut common = Common::deserialize(section).map_err(|e| bad(&e))?;
        if let Some(stats) = doc.get("stats") {
            common.stats = StatsConfig::deserialize(stats.clone()).map_err(|e| bad(&e))?;
        }
        Ok(common)
    }

    /// Checks the settings every middleware has.
    pub fn check(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError(m));
        check_listen("listen address", &self.listen)?;
        if self.workers == 0 || self.workers > 1024 {
            return err(format!("workers must be 1..=1024, not {}", self.workers));
        }
        if self.queue_capacity == 0 {
            return err("queue_capacity must be at least 1".into());
        }
        if self.max_connections == 0 {
            return err("max_connections must be at least 1".into());
        }
        self.stats.validate()
    }
}

/// TLS for the clients (rustls). With `cert` and `key` the listener speaks
/// TLS only; `plain_listen` adds a plaintext listener beside it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Seconds a client may take to finish its TLS handshake before it is
    /// closed (default 10; 0: no limit).
    pub handshake_timeout_secs: u64,
    /// Connections that may be in their TLS handshake at once; past it the
    /// one that has been handshaking longest is closed, so that silent
    /// sockets cannot take every connection slot (default 256).
    pub max_handshaking: usize,
    /// PEM certificate chain of the listener (default: no TLS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// PEM private key of the listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// PEM CA certificates: clients must present a certificate signed by one
    /// of them (default: no client certificates asked for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// A plaintext listener beside the TLS one, host:port (default: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plain_listen: Option<String>,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            handshake_timeout_secs: 10,
            max_handshaking: 256,
            cert: None,
            key: None,
            ca: None,
            plain_listen: None,
        }
    }
}

impl TlsConfig {
    /// Whether the listener speaks TLS.
    pub fn enabled(&self) -> bool {
        self.cert.is_some()
    }

    /// Checks that the settings go together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.cert.is_some() != self.key.is_some() {
            return Err(ConfigError(
                "tls: cert and key go together (the listener's certificate chain and its private key)".into(),
            ));
        }
        if !self.enabled() && (self.ca.is_some() || self.plain_listen.is_some()) {
            return Err(ConfigError("tls: ca and plain_listen need cert and key (a TLS listener)".into()));
        }
        if let Some(a) = &self.plain_listen {
            check_listen("tls plain_listen", a)?;
        }
        if self.max_handshaking == 0 {
            return Err(ConfigError("tls: max_handshaking must be at least 1".into()));
        }
        Ok(())
    }

    /// The listener's rustls configuration, read from the files (`None`
    /// without a certificate); a file that cannot be read refuses the
    /// configuration, naming it.
    pub fn server_config(&self) -> Result<Option<std::sync::Arc<rustls::ServerConfig>>, ConfigError> {
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else { return Ok(None) };
        let ca = self.ca.as_deref().map(Path::new);
        crate::tls::server_config(Path::new(cert), Path::new(key), ca).map(Some).map_err(ConfigError)
    }
}

/// Where measurements go.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatsConfig {
    /// Directory for windows.jsonl, summary.json and trace.csv (default: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out: Option<String>,
    /// Window length in milliseconds; windows start at multiples of it (default 1000).
    pub window_ms: u64,
    /// Trace every k-th request into trace.csv, 0 = no trace (default 100).
    pub trace_every: u64,
    /// Address of the HTTP admin endpoint (/metrics, /stats, /healthz); a bare
    /// port means 127.0.0.1 (default: off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
    /// Name of this process in results files (default: `mw0` for mwproxy,
    /// `mq0` for mwmq).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// A file whose first line is the token that requests changing anything
    /// on the admin endpoint (`POST /reload`) must carry as `Authorization:
    /// Bearer TOKEN` (default: none; then anyone who reaches the endpoint may).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token_file: Option<String>,
}

impl Default for StatsConfig {
    /// 1-second windows, every 100th request traced, no files, no admin endpoint.
    fn default() -> Self {
        StatsConfig {
            out: None,
            window_ms: 1000,
            trace_every: 100,
            admin: None,
            instance: None,
            admin_token_file: None,
        }
    }
}

impl StatsConfig {
    /// The admin address with a bare port expanded to loopback.
    pub fn admin_addr(&self) -> Option<String> {
        self.admin.as_deref().map(admin_addr)
    }

    /// This process's name in results files, or `default`.
    pub fn instance_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.instance.as_deref().unwrap_or(default)
    }

    /// Checks the window length, the admin address and the instance name.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.window_ms < 10 || self.window_ms > 3_600_000 {
            return Err(ConfigError(format!("window_ms must be 10..=3600000, not {}", self.window_ms)));
        }
        if let Some(a) = self.admin_addr() {
            check_addr("admin address", &a)?;
        }
        if let Some(i) = &self.instance {
            if i.is_empty() || i.contains(char::is_whitespace) {
                return Err(ConfigError(format!("instance name {i:?} must be a non-empty word")));
            }
        }
        Ok(())
    }
}

/// Checks that `addr` is `host:port` and resolves (`what` names it in the message).
pub fn check_addr(what: &str, addr: &str) -> Result<(), ConfigError> {
    use std::net::ToSocketAddrs;
    if addr.to_socket_addrs().map(|mut a| a.next().is_none()).unwrap_or(true) {
        return Err(ConfigError(format!("{what} {addr:?} is not host:port")));
    }
    Ok(())
}

/// Checks a listening address: `host:port`, or a unix socket's `/path [mode]`.
pub fn check_listen(what: &str, addr: &str) -> Result<(), ConfigError> {
    match crate::stream::unix_listen(addr) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => check_addr(what, addr),
        Err(why) => Err(ConfigError(format!("{what} {why}"))),
    }
}

/// An admin address with a bare port expanded to loopback.
pub fn admin_addr(a: &str) -> String {
    if a.parse::<u16>().is_ok() {
        format!("127.0.0.1:{a}")
    } else {
        a.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_defaults_fill_what_a_section_leaves_out() {
        let s: StatsConfig = toml::from_str("out = \"/tmp/x\"").unwrap();
        assert_eq!((s.window_ms, s.trace_every, s.instance_or("mw0")), (1000, 100, "mw0"));
        assert!(toml::from_str::<StatsConfig>("windows = 3").is_err(), "unknown keys are refused");
        assert_eq!(StatsConfig::default(), toml::from_str::<StatsConfig>("").unwrap());
        assert_eq!(admin_addr("9100"), "127.0.0.1:9100");
        assert_eq!(admin_addr("0.0.0.0:9100"), "0.0.0.0:9100");
        let bad = StatsConfig { window_ms: 5, ..StatsConfig::default() };
        assert!(bad.validate().unwrap_err().0.contains("window_ms"));
        let bad = StatsConfig { instance: Some("two words".into()), ..StatsConfig::default() };
        assert!(bad.validate().unwrap_err().0.contains("instance"));
        let bad = StatsConfig { admin: Some("no port".into()), ..StatsConfig::default() };
        assert!(bad.validate().unwrap_err().0.contains("admin address"));
        assert!(check_addr("listen address", "127.0.0.1:0").is_ok());
        assert!(check_listen("listen address", "/run/x.sock 0660").is_ok());
        assert!(check_listen("listen address", "/run/x.sock rw").unwrap_err().0.contains("octal"));
        assert!(check_listen("listen address", "nonsense").is_err());
    }
}

/// How a middleware carries requests out (mwproxy's and mwmq's engines).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// Net threads parse, a bounded queue hands requests to workers that
    /// block on the servers or the database (the architecture the lab's models describe).
    Pool,
    /// One event loop per thread owns its clients and pipelined connections
    /// to the servers or the database; no hand-off between threads on the request path.
    Async,
}

impl Engine {
    /// The name used in results files and `stats`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Pool => "pool",
            Engine::Async => "async",
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
