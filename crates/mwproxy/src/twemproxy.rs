//! twemproxy's configuration file (nutcracker.yml), read as mwproxy's.
//!
//! Every memcached pool of the file becomes one mwproxy configuration, served
//! by the same process on the pool's `listen`. Each key twemproxy documents
//! for a pool is carried over or refused by name:
//!
//! | key | in mwproxy |
//! |---|---|
//! | `listen` | `proxy.listen` (host:port, or a unix socket's `/path [mode]`) |
//! | `hash`, `hash_tag`, `distribution` | `routing.key_hash`, `routing.hash_tag`, `routing.hash` |
//! | `servers` (`host:port:weight [name]`) | `routing.servers`, in twemproxy's order (sorted by name) |
//! | `timeout` | `backend.timeout_ms` (twemproxy's default, none, is mwproxy's own default) |
//! | `backlog` | `proxy.backlog` |
//! | `client_connections` | `proxy.max_connections` (0, twemproxy's default, keeps mwproxy's) |
//! | `auto_eject_hosts`, `server_failure_limit`, `server_retry_timeout` | `backend.eject`, `backend.eject_after`, `backend.eject_for_ms` |
//! | `preconnect`, `server_connections` | read and accepted: mwproxy connects at start, one connection per carrier |
//! | `redis: true`, `redis_auth`, `redis_db` | refused: mwproxy serves memcached |
//! | `tcpkeepalive` | read and accepted |
//!
//! mwproxy's own settings (TLS, logins, replication, engines, limits) sit in
//! the pool under `mwproxy:`, in the sections of its TOML file.

use std::path::Path;

use serde::Deserialize;

use crate::config::{Config, ConfigError, HashKind, KeyHash, ServerSpec};
use mcproto::ring::twemproxy_order;

/// The key under which a pool holds mwproxy's own settings.
pub const OWN: &str = "mwproxy";

/// One pool of the file: its name and its settings in mwproxy's TOML shape
/// (to lay the command line's flags over before reading it as a [`Config`]).
#[derive(Debug, Clone)]
pub struct Pool {
    /// The pool's name in the file.
    pub name: String,
    /// Its settings, as sections of mwproxy's configuration.
    pub doc: toml::Table,
}

/// Whether `path` names a twemproxy file (by its extension, as nutcracker's are named).
pub fn is_yaml(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("yml" | "yaml"))
}

/// The pools of the file at `path`.
pub fn read(path: &Path) -> Result<Vec<Pool>, ConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
    parse(&text).map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
}

/// The pools of a nutcracker.yml text.
pub fn parse(text: &str) -> Result<Vec<Pool>, ConfigError> {
    let err = |m: String| ConfigError(m);
    let doc: yaml_serde::Value = yaml_serde::from_str(text).map_err(|e| err(format!("not valid YAML: {e}")))?;
    let yaml_serde::Value::Mapping(pools) = doc else {
        return Err(err("a twemproxy file is a mapping of pool names to their settings".into()));
    };
    if pools.is_empty() {
        return Err(err("no pools".into()));
    }
    let mut out = Vec::new();
    for (name, body) in pools {
        let name = scalar(&name).ok_or_else(|| err("a pool's name must be a string".into()))?;
        let pool = pool(&name, &body).map_err(|m| err(format!("pool {name}: {m}")))?;
        out.push(Pool { name, doc: pool });
    }
    // A unix socket's mode is not part of its address.
    let mut listens: Vec<&str> = out
        .iter()
        .filter_map(|p| p.doc.get("proxy")?.get("listen")?.as_str()?.split_whitespace().next())
        .collect::<Vec<_>>();
    listens.sort_unstable();
    if let Some(w) = listens.windows(2).find(|w| w[0] == w[1]) {
        return Err(err(format!("two pools listen on {}", w[0])));
    }
    Ok(out)
}

fn scalar(v: &yaml_serde::Value) -> Option<String> {
    match v {
        yaml_serde::Value::String(s) => Some(s.clone()),
        yaml_serde::Value::Number(n) => Some(n.to_string()),
        yaml_serde::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn number(key: &str, v: &yaml_serde::Value) -> Result<u64, String> {
    v.as_u64().ok_or_else(|| format!("{key} must be a whole number, not {}", shown(v)))
}

fn boolean(key: &str, v: &yaml_serde::Value) -> Result<bool, String> {
    v.as_bool().ok_or_else(|| format!("{key} must be true or false, not {}", shown(v)))
}

fn shown(v: &yaml_serde::Value) -> String {
    scalar(v).map(|s| format!("{s:?}")).unwrap_or_else(|| "a list or mapping".into())
}

/// Sets `section.key` in the TOML shape.
fn put(doc: &mut toml::Table, section: &str, key: &str, value: toml::Value) -> Result<(), String> {
    let t = doc.entry(section).or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let toml::Value::Table(t) = t else { return Err(format!("{OWN}.{section} must be a mapping")) };
    if t.contains_key(key) {
        return Err(format!("{OWN}.{section}.{key} is set by the pool's own twemproxy settings; give it there, once"));
    }
    t.insert(key.into(), value);
    Ok(())
}

fn pool(name: &str, body: &yaml_serde::Value) -> Result<toml::Table, String> {
    let yaml_serde::Value::Mapping(body) = body else {
        return Err("its settings must be a mapping".into());
    };
    let get = |k: &str| body.get(k);
    if get("redis").and_then(|v| v.as_bool()) == Some(true) {
        return Err("is a redis pool (redis: true): mwproxy serves memcached only".into());
    }
    let mut doc = match get(OWN) {
        Some(own) => toml::Table::deserialize(own.clone())
            .map_err(|e| format!("{OWN}: not mwproxy's settings in the sections of its TOML file: {e}"))?,
        None => toml::Table::new(),
    };
    for (key, value) in body {
        let key = scalar(key).unwrap_or_default();
        match key.as_str() {
            OWN => {}
            "listen" => {
                let listen = scalar(value).ok_or("listen must be host:port or /path [mode]")?;
                let unix = mwserve::stream::unix_listen(&listen).map_err(|e| format!("listen {e}"))?;
                if unix.is_none() && !listen.contains(':') {
                    return Err(format!("listen {listen:?} must be host:port or /path [mode]"));
                }
                put(&mut doc, "proxy", "listen", toml::Value::String(listen))?;
            }
            "hash" => {
                let h: KeyHash = scalar(value).unwrap_or_default().parse().map_err(|e| format!("hash: {e}"))?;
                put(&mut doc, "routing", "key_hash", toml::Value::String(h.name().into()))?;
            }
            "hash_tag" => {
                let tag = scalar(value).unwrap_or_default();
                if tag.len() != 2 {
                    return Err(format!("hash_tag {tag:?} must be two characters, e.g. \"{{}}\""));
                }
                put(&mut doc, "routing", "hash_tag", toml::Value::String(tag))?;
            }
            "distribution" => {
                let d = match scalar(value).unwrap_or_default().as_str() {
                    "ketama" => HashKind::Ketama,
                    "modula" => HashKind::Modula,
                    "random" => HashKind::Random,
                    other => return Err(format!("distribution {other:?}: ketama, modula or random")),
                };
                let text = toml::Value::try_from(d).map_err(|e| e.to_string())?;
                put(&mut doc, "routing", "hash", text)?;
            }
            "timeout" => {
                let ms = number("timeout", value)?.max(1);
                put(&mut doc, "backend", "timeout_ms", toml::Value::Integer(ms as i64))?;
                // Stall detection must answer before the timeout does.
                if ms <= crate::config::BackendConfig::default().stall_ms {
                    put(&mut doc, "backend", "stall_ms", toml::Value::Integer((ms / 2) as i64))?;
                }
            }
            "backlog" => {
                let n = number("backlog", value)?.clamp(1, i32::MAX as u64);
                put(&mut doc, "proxy", "backlog", toml::Value::Integer(n as i64))?;
            }
            "client_connections" => {
                let n = number("client_connections", value)?;
                if n > 0 {
                    put(&mut doc, "proxy", "max_connections", toml::Value::Integer(n as i64))?;
                }
            }
            "auto_eject_hosts" => {
                put(&mut doc, "backend", "eject", toml::Value::Boolean(boolean(&key, value)?))?;
            }
            "server_failure_limit" => {
                let n = number(&key, value)?.max(1);
                put(&mut doc, "backend", "eject_after", toml::Value::Integer(n as i64))?;
            }
            "server_retry_timeout" => {
                let n = number(&key, value)?.max(1);
                put(&mut doc, "backend", "eject_for_ms", toml::Value::Integer(n as i64))?;
            }
            "preconnect" | "tcpkeepalive" => {
                boolean(&key, value)?;
            }
            "server_connections" => {
                if number(&key, value)? == 0 {
                    return Err("server_connections cannot be 0".into());
                }
            }
            "redis" => {
                boolean(&key, value)?;
            }
            "redis_auth" | "redis_db" => {
                return Err(format!("{key}: a redis setting, and mwproxy serves memcached only"));
            }
            "servers" => {
                let list = value.as_sequence().ok_or("servers must be a list of host:port:weight [name]")?;
                let mut servers = Vec::new();
                for s in list {
                    let text = scalar(s).ok_or("servers must be a list of host:port:weight [name]")?;
                    let spec: ServerSpec = text.parse().map_err(|e| format!("{e}"))?;
                    let colons = if spec.is_unix() { 1 } else { 2 };
                    if text.split_whitespace().next().is_none_or(|a| a.matches(':').count() < colons) {
                        return Err(format!(
                            "server {text:?}: twemproxy writes host:port:weight [name] or /path:weight [name]"
                        ));
                    }
                    servers.push(spec);
                }
                twemproxy_order(&mut servers);
                // Sorted by name already (twemproxy's rule for twins too): twins are neighbours.
                let names: Vec<String> = servers.iter().map(mcproto::ring::ring_name).collect();
                if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
                    return Err(format!("two servers named {}", w[0]));
                }
                let list = servers.iter().map(|s| toml::Value::String(s.to_string())).collect();
                put(&mut doc, "routing", "servers", toml::Value::Array(list))?;
            }
            other => return Err(format!("unknown setting {other:?} (twemproxy's settings of a pool, or {OWN}:)")),
        }
    }
    if get("listen").is_none() {
        return Err("listen is missing".into());
    }
    if get("servers").is_none() {
        return Err("servers are missing".into());
    }
    // Results and logs name the process after its pool unless told otherwise.
    if doc.get("stats").and_then(|s| s.get("instance")).is_none() {
        put(&mut doc, "stats", "instance", toml::Value::String(name.to_string()))?;
    }
    Ok(doc)
}

/// A pool's [`Config`] with nothing laid over it (tests, `--print-config`).
pub fn config(pool: &Pool) -> Result<Config, ConfigError> {
    use mwserve::config::ServiceConfig;
    Config::from_table(pool.doc.clone(), toml::Table::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "
alpha:
  listen: 127.0.0.1:22121
  hash: fnv1a_64
  hash_tag: \"{}\"
  distribution: ketama
  auto_eject_hosts: true
  server_retry_timeout: 2000
  server_failure_limit: 3
  timeout: 400
  backlog: 1024
  preconnect: true
  client_connections: 100
  server_connections: 1
  servers:
   - 127.0.0.1:11212:1 zz
   - 127.0.0.1:11211:2 aa
  mwproxy:
    routing:
      replication: 2
beta:
  listen: 127.0.0.1:22122
  distribution: modula
  servers:
   - 127.0.0.1:11213:1
";

    #[test]
    fn every_pool_becomes_a_configuration() {
        let pools = parse(TWO).unwrap();
        assert_eq!(pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["alpha", "beta"]);
        let a = config(&pools[0]).unwrap();
        assert_eq!(a.proxy.listen, "127.0.0.1:22121");
        assert_eq!(a.routing.key_hash, KeyHash::Fnv1a64);
        assert_eq!(a.routing.hash_tag, "{}");
        assert_eq!(a.routing.hash, HashKind::Ketama);
        assert_eq!(a.routing.replication, 2);
        assert_eq!(a.backend.timeout_ms, 400);
        assert_eq!(a.proxy.backlog, 1024);
        assert_eq!(a.proxy.max_connections, 100);
        assert!(a.backend.eject);
        assert_eq!((a.backend.eject_after, a.backend.eject_for_ms), (3, 2000));
        // twemproxy's order: by name.
        let names: Vec<_> = a.routing.servers.iter().map(|s| s.name.clone().unwrap()).collect();
        assert_eq!(names, ["aa", "zz"]);
        assert_eq!(a.routing.servers[0].weight, 2);
        assert_eq!(a.stats.instance.as_deref(), Some("alpha"));
        let b = config(&pools[1]).unwrap();
        assert_eq!(b.routing.hash, HashKind::Modula);
        assert_eq!(b.routing.key_hash, KeyHash::Md5, "mwproxy's default where the file says nothing");
        assert!(!b.backend.eject);
    }

    #[test]
    fn what_cannot_be_carried_over_is_refused_by_name() {
        let cases = [
            ("r:\n  listen: 127.0.0.1:1\n  redis: true\n  servers: [\"a:1:1\"]\n", "pool r: is a redis pool"),
            ("r:\n  listen: 127.0.0.1:1\n  redis_auth: x\n  servers: [\"a:1:1\"]\n", "redis_auth"),
            ("p:\n  listen: /tmp/s.sock 0999\n  servers: [\"a:1:1\"]\n", "octal"),
            ("p:\n  listen: 127.0.0.1:1\n  servers: [\"/tmp/m.sock\"]\n", "/path:weight [name]"),
            ("p:\n  listen: 127.0.0.1:1\n  hash: sha1\n  servers: [\"a:1:1\"]\n", "hash: unknown hash \"sha1\""),
            ("p:\n  listen: 127.0.0.1:1\n  distribution: vnode\n  servers: [\"a:1:1\"]\n", "ketama, modula or random"),
            ("p:\n  listen: 127.0.0.1:1\n  hash_tag: \"{\"\n  servers: [\"a:1:1\"]\n", "two characters"),
            ("p:\n  listen: 127.0.0.1:1\n  colour: red\n  servers: [\"a:1:1\"]\n", "unknown setting \"colour\""),
            ("p:\n  listen: 127.0.0.1:1\n  timeout: soon\n  servers: [\"a:1:1\"]\n", "timeout must be a whole number"),
            ("p:\n  listen: 127.0.0.1:1\n", "servers are missing"),
            ("p:\n  servers: [\"a:1:1\"]\n", "listen is missing"),
            ("p:\n  listen: 127.0.0.1:1\n  servers: [\"a:1\"]\n", "host:port:weight"),
            ("p:\n  listen: 127.0.0.1:1\n  servers: [\"a:1:1 x\", \"b:1:1 x\"]\n", "two servers named x"),
            (
                "p:\n  listen: 127.0.0.1:1\n  servers: [\"a:1:1\"]\n  mwproxy: {routing: {servers: [\"b:1\"]}}\n",
                "mwproxy.routing.servers is set by the pool's own",
            ),
            ("p:\n  listen: 127.0.0.1:1\n  servers: [\"a:1:1\"]\nq:\n  listen: 127.0.0.1:1\n  servers: [\"a:1:1\"]\n", "two pools listen"),
            ("- a\n- b\n", "mapping of pool names"),
            ("p: [\n", "not valid YAML"),
        ];
        for (text, wanted) in cases {
            let e = parse(text).map(|_| ()).unwrap_err().0;
            assert!(e.contains(wanted), "{text:?}: {e}");
        }
        // mwproxy's own sections are checked as in its TOML file.
        let bad = "p:\n  listen: 127.0.0.1:1\n  servers: [\"a:1:1\"]\n  mwproxy: {routing: {replicas: 2}}\n";
        let e = config(&parse(bad).unwrap()[0]).unwrap_err().0;
        assert!(e.contains("replicas"), "{e}");
    }

    #[test]
    fn yaml_files_are_recognised_by_their_extension() {
        assert!(is_yaml(Path::new("/etc/nutcracker/nutcracker.yml")));
        assert!(is_yaml(Path::new("x.yaml")));
        assert!(!is_yaml(Path::new("mwproxy.toml")));
    }
}
