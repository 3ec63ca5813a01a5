//! Key placement: the ketama continuum of libmemcached and twemproxy, and modula.
//!
//! Ketama, as both libraries build it (so mwproxy can replace either without
//! moving a key):
//! - a server's name on the ring is `host` when its port is 11211 and
//!   `host:port` otherwise;
//! - its number of points is `floor(weight/total * 40 * n + 1e-10) * 4`,
//!   computed in single precision like the C code (160 for equal weights);
//! - for i in 0..points/4 the md5 of `name-i` gives four points, each the
//!   little-endian u32 of one quarter of the digest;
//! - a key's point is the little-endian u32 of the first quarter of md5(key),
//!   and its server owns the first ring point at or after it, wrapping around.
//!
//! With replication R a key lives on the R distinct servers met clockwise
//! from its point; the first is the primary.

use std::fmt;
use std::str::FromStr;

use md5::{Digest, Md5};

/// Key-to-server mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashKind {
    /// libmemcached/twemproxy-compatible ketama consistent hashing (md5).
    Ketama,
    /// md5 of the key modulo the number of servers.
    Modula,
}

/// One memcached server: `host:port[:weight]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSpec {
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Share of the ring (default 1).
    pub weight: u32,
}

/// A server given in a form that is not `host:port[:weight]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadServer(pub String);

impl fmt::Display for BadServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadServer {}

impl ServerSpec {
    /// `host:port` (IPv6 hosts in brackets).
    pub fn endpoint(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl FromStr for ServerSpec {
    type Err = BadServer;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| BadServer(format!("server {s:?}: {why} (expected host:port[:weight])"));
        let (host, rest) = if let Some(stripped) = s.strip_prefix('[') {
            let end = stripped.find(']').ok_or_else(|| bad("unclosed ["))?;
            let rest = stripped[end + 1..].strip_prefix(':').ok_or_else(|| bad("missing port"))?;
            (stripped[..end].to_string(), rest)
        } else {
            let (h, r) = s.split_once(':').ok_or_else(|| bad("missing port"))?;
            (h.to_string(), r)
        };
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        let (port, weight) = match rest.split_once(':') {
            Some((p, w)) => (p, Some(w)),
            None => (rest, None),
        };
        let port: u16 = port.parse().map_err(|_| bad("bad port"))?;
        if port == 0 {
            return Err(bad("port 0"));
        }
        let weight = match weight {
            Some(w) => {
                w.parse::<u32>().ok().filter(|&w| w > 0).ok_or_else(|| bad("weight must be a positive integer"))?
            }
            None => 1,
        };
        Ok(ServerSpec { host, port, weight })
    }
}

impl fmt::Display for ServerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.endpoint(), self.weight)
    }
}

/// A server's name on the ring.
fn ring_name(s: &ServerSpec) -> String {
    if s.port == 11211 {
        s.host.clone()
    } else {
        format!("{}:{}", s.host, s.port)
    }
}

fn md5_quarter(digest: &[u8], q: usize) -> u32 {
    u32::from_le_bytes([digest[q * 4], digest[q * 4 + 1], digest[q * 4 + 2], digest[q * 4 + 3]])
}

/// The ring point of a key.
pub fn key_hash(key: &[u8]) -> u32 {
    md5_quarter(&Md5::digest(key), 0)
}

/// Maps keys to servers.
#[derive(Clone, Debug)]
pub struct Ring {
    kind: HashKind,
    servers: usize,
    /// (point, server index), sorted by point.
    points: Vec<(u32, u32)>,
}

impl Ring {
    /// Builds the ring for `servers` (in configuration order).
    pub fn new(kind: HashKind, servers: &[ServerSpec]) -> Ring {
        assert!(!servers.is_empty(), "a ring needs servers");
        let mut points = Vec::new();
        if kind == HashKind::Ketama {
            let total: u32 = servers.iter().map(|s| s.weight).sum();
            let n = servers.len() as f32;
            for (index, s) in servers.iter().enumerate() {
                let pct = s.weight as f32 / total as f32;
                let scaled = ((pct * 160.0 / 4.0 * n) as f64 + 0.0000000001) as f32;
                let per_server = (scaled.floor() as u32) * 4;
                let name = ring_name(s);
                for i in 0..per_server / 4 {
                    let digest = Md5::digest(format!("{name}-{i}").as_bytes());
                    for q in 0..4 {
                        points.push((md5_quarter(&digest, q), index as u32));
                    }
                }
            }
            points.sort_unstable();
        }
        Ring { kind, servers: servers.len(), points }
    }

    /// Number of servers.
    pub fn len(&self) -> usize {
        self.servers
    }

    /// Whether the ring has no servers (never true for a built ring).
    pub fn is_empty(&self) -> bool {
        self.servers == 0
    }

    /// The primary server of `key`.
    pub fn server_for(&self, key: &[u8]) -> usize {
        let h = key_hash(key);
        match self.kind {
            HashKind::Modula => h as usize % self.servers,
            HashKind::Ketama => self.points[self.start(h)].1 as usize,
        }
    }

    fn start(&self, h: u32) -> usize {
        let i = self.points.partition_point(|&(p, _)| p < h);
        if i == self.points.len() {
            0
        } else {
            i
        }
    }

    /// The `r` distinct servers holding `key`, primary first, written into `out`.
    pub fn replicas_into(&self, key: &[u8], r: usize, out: &mut Vec<usize>) {
        out.clear();
        let r = r.min(self.servers);
        let h = key_hash(key);
        match self.kind {
            HashKind::Modula => {
                let first = h as usize % self.servers;
                out.extend((0..r).map(|i| (first + i) % self.servers));
            }
            HashKind::Ketama => {
                let start = self.start(h);
                let n = self.points.len();
                for step in 0..n {
                    let s = self.points[(start + step) % n].1 as usize;
                    if !out.contains(&s) {
                        out.push(s);
                        if out.len() == r {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// The `r` distinct servers holding `key`, primary first.
    pub fn replicas(&self, key: &[u8], r: usize) -> Vec<usize> {
        let mut v = Vec::with_capacity(r);
        self.replicas_into(key, r, &mut v);
        v
    }

    /// Every set of `r` servers that holds some key (each set sorted, each
    /// once): a key is unreachable exactly when every server of its set is.
    pub fn replica_sets(&self, r: usize) -> Vec<Vec<usize>> {
        let r = r.min(self.servers);
        let mut sets: Vec<Vec<usize>> = match self.kind {
            HashKind::Modula => {
                (0..self.servers).map(|first| (0..r).map(|i| (first + i) % self.servers).collect()).collect()
            }
            HashKind::Ketama => {
                let n = self.points.len();
                (0..n)
                    .map(|start| {
                        let mut set = Vec::with_capacity(r);
                        for step in 0..n {
                            let s = self.points[(start + step) % n].1 as usize;
                            if !set.contains(&s) {
                                set.push(s);
                                if set.len() == r {
                                    break;
                                }
                            }
                        }
                        set
                    })
                    .collect()
            }
        };
        for set in &mut sets {
            set.sort_unstable();
        }
        sets.sort_unstable();
        sets.dedup();
        sets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(specs: &[&str]) -> Vec<ServerSpec> {
        specs.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn replica_sets_are_the_sets_keys_land_on() {
        let ring = Ring::new(HashKind::Ketama, &servers(&["a:1", "b:1", "c:1", "d:1"]));
        assert_eq!(ring.replica_sets(1), vec![vec![0], vec![1], vec![2], vec![3]]);
        assert_eq!(ring.replica_sets(4), vec![vec![0, 1, 2, 3]]);
        let pairs = ring.replica_sets(2);
        for i in 0..2000 {
            let mut r = ring.replicas(format!("k{i}").as_bytes(), 2);
            r.sort_unstable();
            assert!(pairs.contains(&r), "{r:?}");
        }
        let modula = Ring::new(HashKind::Modula, &servers(&["a:1", "b:1", "c:1"]));
        assert_eq!(modula.replica_sets(2), vec![vec![0, 1], vec![0, 2], vec![1, 2]]);
    }

    #[test]
    fn equal_weights_give_160_points_each() {
        for n in 1..=12 {
            let specs: Vec<String> = (0..n).map(|i| format!("10.0.0.{i}:11211")).collect();
            let refs: Vec<&str> = specs.iter().map(|s| s.as_str()).collect();
            let ring = Ring::new(HashKind::Ketama, &servers(&refs));
            assert_eq!(ring.points.len(), 160 * n, "{n} servers");
        }
    }

    #[test]
    fn weights_are_honoured() {
        let ring = Ring::new(HashKind::Ketama, &servers(&["a:1:1", "b:1:3"]));
        let heavy = ring.points.iter().filter(|p| p.1 == 1).count();
        let light = ring.points.len() - heavy;
        assert_eq!((light, heavy), (80, 240));
    }

    #[test]
    fn ring_names_follow_libmemcached() {
        assert_eq!(ring_name(&"h:11211".parse().unwrap()), "h");
        assert_eq!(ring_name(&"h:11212".parse().unwrap()), "h:11212");
    }

    #[test]
    fn key_hash_is_md5_little_endian() {
        // md5("") = d41d8cd98f00b204e9800998ecf8427e
        assert_eq!(key_hash(b""), 0xd98c1dd4);
    }

    #[test]
    fn replicas_are_distinct_and_start_with_the_primary() {
        let ring = Ring::new(HashKind::Ketama, &servers(&["a:1", "b:1", "c:1", "d:1"]));
        for i in 0..1000 {
            let key = format!("key{i}");
            let r = ring.replicas(key.as_bytes(), 3);
            assert_eq!(r.len(), 3);
            assert_eq!(r[0], ring.server_for(key.as_bytes()));
            assert!(r[0] != r[1] && r[1] != r[2] && r[0] != r[2]);
        }
        assert_eq!(ring.replicas(b"x", 9).len(), 4);
    }

    #[test]
    fn server_specs() {
        let s: ServerSpec = "10.0.0.1:11211:3".parse().unwrap();
        assert_eq!((s.host.as_str(), s.port, s.weight), ("10.0.0.1", 11211, 3));
        let s: ServerSpec = "[::1]:11211".parse().unwrap();
        assert_eq!((s.host.as_str(), s.weight, s.endpoint()), ("::1", 1, "[::1]:11211".to_string()));
        for bad in ["", "host", "host:", "host:x", ":11211", "h:1:0", "h:1:-2", "h:70000"] {
            assert!(bad.parse::<ServerSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn modula_spreads_keys() {
        let ring = Ring::new(HashKind::Modula, &servers(&["a:1", "b:1", "c:1"]));
        let mut counts = [0; 3];
        for i in 0..3000 {
            counts[ring.server_for(format!("k{i}").as_bytes())] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
        assert_eq!(ring.replicas(b"k", 2).len(), 2);
    }
}
