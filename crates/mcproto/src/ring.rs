//! Key placement: the ketama continuum of libmemcached and twemproxy, modula
//! and random, with any of twemproxy's key hashes and a hash tag.
//!
//! Ketama, as both libraries build it (so mwproxy can replace either without
//! moving a key):
//! - a server's name on the ring is its configured name when it has one
//!   (twemproxy's `host:port:weight name`), else `host` when its port is
//!   11211 and `host:port` otherwise;
//! - its number of points is `floor(weight/total * 40 * n + 1e-10) * 4`,
//!   computed in single precision like the C code (160 for equal weights);
//! - for i in 0..points/4 the md5 of `name-i` (cut at 85 bytes, as
//!   twemproxy's buffer cuts it) gives four points, each the little-endian
//!   u32 of one quarter of the digest;
//! - a key's point is its hash (md5's first quarter by default, or the
//!   pool's `hash`, of the part a hash tag selects), and its server owns the
//!   first ring point at or after it, wrapping around.
//!
//! Modula: every server holds `weight` consecutive slots, a key the slot
//! `hash % slots`. Random: a server chosen at random for every request, as
//! twemproxy's `distribution: random` (no key has a place).
//!
//! With replication R a key lives on the R distinct servers met clockwise
//! from its point (the next slots for modula); the first is the primary.

use std::cell::Cell;
use std::fmt;
use std::str::FromStr;

use md5::{Digest, Md5};

use crate::hashkit::tagged;
pub use crate::hashkit::KeyHash;

/// Key-to-server mapping (twemproxy's `distribution`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HashKind {
    /// libmemcached/twemproxy-compatible ketama consistent hashing.
    #[default]
    Ketama,
    /// The key's hash modulo the servers' total weight.
    Modula,
    /// A random server per request.
    Random,
}

/// How keys are placed: the distribution, the key hash, the hash tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Placement {
    /// Ketama, modula or random.
    pub distribution: HashKind,
    /// The function that hashes a key (md5 by default).
    pub hash: KeyHash,
    /// Two characters: only what a key holds between them is hashed.
    pub tag: Option<[u8; 2]>,
}

impl Placement {
    /// The hash of `key` under this placement (0 for an empty key, as twemproxy).
    pub fn key_hash(&self, key: &[u8]) -> u32 {
        let part = tagged(key, self.tag);
        if part.is_empty() {
            0
        } else {
            self.hash.hash(part)
        }
    }
}

/// One memcached server: `host:port[:weight]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSpec {
    /// Host name or IP address, or a unix socket's path (an absolute one).
    pub host: String,
    /// TCP port (0 for a unix socket).
    pub port: u16,
    /// Share of the ring (default 1).
    pub weight: u32,
    /// Its name on the ring, when one is given (`host:port:weight name`).
    pub name: Option<String>,
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
    /// Whether it is a unix socket (`/path[:weight]`).
    pub fn is_unix(&self) -> bool {
        self.port == 0 && self.host.starts_with('/')
    }

    /// `host:port` (IPv6 hosts in brackets), or a unix socket's path.
    pub fn endpoint(&self) -> String {
        if self.is_unix() {
            self.host.clone()
        } else if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl FromStr for ServerSpec {
    type Err = BadServer;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            BadServer(format!("server {s:?}: {why} (expected host:port[:weight] [name] or /unix/path[:weight] [name])"))
        };
        let (s, name) = match s.trim().split_once(char::is_whitespace) {
            Some((addr, name)) => (addr, Some(name.trim())),
            None => (s.trim(), None),
        };
        if name.is_some_and(|n| n.is_empty() || n.contains(char::is_whitespace)) {
            return Err(bad("a name is one word"));
        }
        let weigh = |w: Option<&str>| match w {
            Some(w) => w.parse::<u32>().ok().filter(|&w| w > 0).ok_or_else(|| bad("weight must be a positive integer")),
            None => Ok(1),
        };
        if s.starts_with('/') {
            // A unix socket: the weight, if any, after the last colon (as twemproxy reads it).
            let (path, w) = match s.rsplit_once(':') {
                Some((p, w)) if !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()) => (p, Some(w)),
                _ => (s, None),
            };
            let weight = weigh(w)?;
            return Ok(ServerSpec { host: path.to_string(), port: 0, weight, name: name.map(str::to_string) });
        }
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
        let weight = weigh(weight)?;
        Ok(ServerSpec { host, port, weight, name: name.map(str::to_string) })
    }
}

impl fmt::Display for ServerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.endpoint(), self.weight)?;
        match &self.name {
            Some(name) => write!(f, " {name}"),
            None => Ok(()),
        }
    }
}

/// A server's name on the ring (and in twemproxy's stats): its configured
/// name, else `host` on port 11211 and `host:port` otherwise; a unix
/// socket's is its path and the colon after it (`/path:`, as twemproxy
/// names it: the host and a port that is empty).
pub fn ring_name(s: &ServerSpec) -> String {
    if let Some(name) = &s.name {
        name.clone()
    } else if s.is_unix() {
        format!("{}:", s.host)
    } else if s.port == 11211 {
        s.host.clone()
    } else {
        format!("{}:{}", s.host, s.port)
    }
}

fn md5_quarter(digest: &[u8], q: usize) -> u32 {
    u32::from_le_bytes([digest[q * 4], digest[q * 4 + 1], digest[q * 4 + 2], digest[q * 4 + 3]])
}

/// Puts `servers` in the order twemproxy keeps a pool's servers: by name on
/// the ring, shorter names first, then byte by byte (it sorts them to refuse
/// duplicates and keeps that order). Modula's slots follow it.
pub fn twemproxy_order(servers: &mut [ServerSpec]) {
    servers.sort_by(|a, b| {
        let (a, b) = (ring_name(a), ring_name(b));
        a.len().cmp(&b.len()).then_with(|| a.as_bytes().cmp(b.as_bytes()))
    });
}

/// The longest `name-i` twemproxy hashes (its buffer of 86 bytes, one for the NUL).
const KETAMA_MAX_HOST: usize = 85;

thread_local! {
    static RANDOM: Cell<u64> = Cell::new(std::ptr::from_ref(&KETAMA_MAX_HOST) as u64 ^ std::process::id() as u64 | 1);
}

/// A random number for the random distribution (xorshift, per thread).
fn random() -> u64 {
    RANDOM.with(|r| {
        let mut x = r.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        r.set(x);
        x
    })
}

/// Maps keys to servers.
#[derive(Clone, Debug)]
pub struct Ring {
    placement: Placement,
    servers: usize,
    /// Ketama: (point, server index), sorted by point.
    points: Vec<(u32, u32)>,
    /// Modula and random: the server of every slot.
    slots: Vec<u32>,
}

impl Ring {
    /// Builds the ring for `servers` (in configuration order), md5 keys, no hash tag.
    pub fn new(kind: HashKind, servers: &[ServerSpec]) -> Ring {
        Ring::with(Placement { distribution: kind, ..Placement::default() }, servers)
    }

    /// Builds the ring for `servers` (in configuration order) with a placement.
    pub fn with(placement: Placement, servers: &[ServerSpec]) -> Ring {
        Ring::with_live(placement, servers, &vec![true; servers.len()])
    }

    /// The ring of the servers marked `live` only (the others ejected, as
    /// twemproxy rebuilds it: points and weights shared among the live
    /// ones), the servers keeping their numbers. With none live, every one is.
    pub fn with_live(placement: Placement, servers: &[ServerSpec], live: &[bool]) -> Ring {
        assert!(!servers.is_empty(), "a ring needs servers");
        assert_eq!(live.len(), servers.len(), "a liveness per server");
        let all = vec![true; servers.len()];
        let live = if live.iter().any(|&l| l) { live } else { &all };
        let kind = placement.distribution;
        let mut points = Vec::new();
        let mut slots = Vec::new();
        let on = || servers.iter().enumerate().filter(|(i, _)| live[*i]);
        match kind {
            HashKind::Modula => {
                for (index, s) in on() {
                    slots.extend(std::iter::repeat_n(index as u32, s.weight as usize));
                }
            }
            HashKind::Random => slots.extend(on().map(|(i, _)| i as u32)),
            HashKind::Ketama => {}
        }
        if kind == HashKind::Ketama {
            let total: u32 = on().map(|(_, s)| s.weight).sum();
            let n = on().count() as f32;
            for (index, s) in on() {
                let pct = s.weight as f32 / total as f32;
                let scaled = ((pct * 160.0 / 4.0 * n) as f64 + 0.0000000001) as f32;
                let per_server = (scaled.floor() as u32) * 4;
                let name = ring_name(s);
                for i in 0..per_server / 4 {
                    let mut host = format!("{name}-{i}").into_bytes();
                    host.truncate(KETAMA_MAX_HOST);
                    let digest = Md5::digest(&host);
                    for q in 0..4 {
                        points.push((md5_quarter(&digest, q), index as u32));
                    }
                }
            }
            points.sort_unstable();
        }
        Ring { placement, servers: servers.len(), points, slots }
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
        if self.servers == 1 {
            return 0;
        }
        match self.placement.distribution {
            HashKind::Ketama => self.points[self.start(self.placement.key_hash(key))].1 as usize,
            _ => self.slots[self.slot(key)] as usize,
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

    /// The slot of `key` (modula and random).
    fn slot(&self, key: &[u8]) -> usize {
        match self.placement.distribution {
            HashKind::Random => (random() % self.slots.len() as u64) as usize,
            _ => self.placement.key_hash(key) as usize % self.slots.len(),
        }
    }

    /// The `r` distinct servers holding `key`, primary first, written into `out`.
    pub fn replicas_into(&self, key: &[u8], r: usize, out: &mut Vec<usize>) {
        out.clear();
        let r = r.min(self.servers);
        if self.servers == 1 {
            out.push(0);
            return;
        }
        let (start, n) = match self.placement.distribution {
            HashKind::Ketama => (self.start(self.placement.key_hash(key)), self.points.len()),
            _ => (self.slot(key), self.slots.len()),
        };
        for step in 0..n {
            let s = self.at((start + step) % n);
            if !out.contains(&s) {
                out.push(s);
                if out.len() == r {
                    break;
                }
            }
        }
    }

    /// The server at a position of the ring (ketama) or of the slots.
    fn at(&self, i: usize) -> usize {
        match self.placement.distribution {
            HashKind::Ketama => self.points[i].1 as usize,
            _ => self.slots[i] as usize,
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
        let n = if self.placement.distribution == HashKind::Ketama { self.points.len() } else { self.slots.len() };
        let mut sets: Vec<Vec<usize>> = (0..n)
            .map(|start| {
                let mut set = Vec::with_capacity(r);
                for step in 0..n {
                    let s = self.at((start + step) % n);
                    if !set.contains(&s) {
                        set.push(s);
                        if set.len() == r {
                            break;
                        }
                    }
                }
                set
            })
            .collect();
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
        assert_eq!(ring_name(&"/run/mc.sock:2".parse().unwrap()), "/run/mc.sock:");
        assert_eq!(ring_name(&"/run/mc.sock:2 a".parse().unwrap()), "a");
    }

    #[test]
    fn unix_sockets_are_servers_with_a_path() {
        let s: ServerSpec = "/run/mc.sock:3 one".parse().unwrap();
        assert_eq!((s.host.as_str(), s.port, s.weight, s.is_unix()), ("/run/mc.sock", 0, 3, true));
        assert_eq!(s.to_string(), "/run/mc.sock:3 one");
        assert_eq!(s.endpoint(), "/run/mc.sock");
        let plain: ServerSpec = "/run/mc.sock".parse().unwrap();
        assert_eq!((plain.host.as_str(), plain.weight), ("/run/mc.sock", 1));
        assert_eq!(plain.to_string().parse::<ServerSpec>().unwrap(), plain);
        assert!("/run/mc.sock:0".parse::<ServerSpec>().is_err());
    }

    #[test]
    fn named_servers_and_long_names() {
        let s: ServerSpec = "10.0.0.1:11211:2 cache-a".parse().unwrap();
        assert_eq!(
            (s.weight, s.name.as_deref(), s.to_string()),
            (2, Some("cache-a"), "10.0.0.1:11211:2 cache-a".into())
        );
        assert_eq!(ring_name(&s), "cache-a");
        assert!("h:1:1 two words".parse::<ServerSpec>().is_err());
        // A name is what the ring hashes: the same names, the same ring,
        // wherever the servers are.
        let a = Ring::new(HashKind::Ketama, &servers(&["a:1:1 one", "b:1:1 two"]));
        let b = Ring::new(HashKind::Ketama, &servers(&["c:9:1 one", "d:9:1 two"]));
        assert_eq!(a.points, b.points);
        // Names past twemproxy's 85 bytes are cut: two that differ only
        // beyond that give one ring point set.
        let long = "n".repeat(90);
        let x = Ring::new(HashKind::Ketama, &servers(&[&format!("a:1:1 {long}x"), "b:1:1 b"]));
        let y = Ring::new(HashKind::Ketama, &servers(&[&format!("a:1:1 {long}y"), "b:1:1 b"]));
        assert_eq!(x.points, y.points);
    }

    #[test]
    fn twemproxy_orders_servers_by_name_length_then_bytes() {
        let mut s = servers(&["b:11211", "a:11212", "zz:11211", "a:11211:1 m", "c:11211"]);
        twemproxy_order(&mut s);
        let names: Vec<String> = s.iter().map(ring_name).collect();
        assert_eq!(names, ["b", "c", "m", "zz", "a:11212"]);
    }

    #[test]
    fn modula_honours_weights_and_random_uses_every_server() {
        let ring = Ring::with(
            Placement { distribution: HashKind::Modula, hash: KeyHash::Fnv1a64, tag: None },
            &servers(&["a:1:1", "b:1:3"]),
        );
        assert_eq!(ring.slots, vec![0, 1, 1, 1]);
        for i in 0..200 {
            let key = format!("k{i}");
            assert_eq!(
                ring.server_for(key.as_bytes()),
                ring.slots[KeyHash::Fnv1a64.hash(key.as_bytes()) as usize % 4] as usize
            );
        }
        let random = Ring::with(
            Placement { distribution: HashKind::Random, ..Placement::default() },
            &servers(&["a:1", "b:1", "c:1"]),
        );
        let mut seen = [0; 3];
        for _ in 0..300 {
            seen[random.server_for(b"same key")] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
    }

    #[test]
    fn an_ejected_server_leaves_the_ring_to_the_others() {
        let specs = servers(&["a:1", "b:1", "c:1"]);
        for distribution in [HashKind::Ketama, HashKind::Modula] {
            let placement = Placement { distribution, hash: KeyHash::Fnv1a64, tag: None };
            let full = Ring::with(placement, &specs);
            let two = Ring::with_live(placement, &specs, &[true, false, true]);
            for i in 0..2000 {
                let k = format!("k{i}");
                let (before, after) = (full.server_for(k.as_bytes()), two.server_for(k.as_bytes()));
                assert_ne!(after, 1, "{distribution:?}: nothing goes to the ejected server");
                if distribution == HashKind::Ketama && before != 1 {
                    assert_eq!(before, after, "ketama moves only the ejected server's keys");
                }
            }
            // As twemproxy: the ring of the live servers is the ring of those servers alone.
            let alone = Ring::with(placement, &servers(&["a:1", "c:1"]));
            for i in 0..500 {
                let k = format!("k{i}");
                let map = [0, 2];
                assert_eq!(two.server_for(k.as_bytes()), map[alone.server_for(k.as_bytes())]);
            }
            // None live: all are.
            assert_eq!(Ring::with_live(placement, &specs, &[false; 3]).points, full.points);
        }
    }

    #[test]
    fn a_hash_tag_places_keys_by_their_tag() {
        let tagged = Placement { distribution: HashKind::Ketama, hash: KeyHash::Murmur, tag: Some(*b"{}") };
        let ring = Ring::with(tagged, &servers(&["a:1", "b:1", "c:1", "d:1"]));
        for i in 0..100 {
            let t = format!("user{i}");
            let first = ring.server_for(format!("{{{t}}}:name").as_bytes());
            assert_eq!(first, ring.server_for(format!("x:{{{t}}}:mail").as_bytes()));
            assert_eq!(first, ring.server_for(t.as_bytes()));
        }
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
