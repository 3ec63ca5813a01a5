//! Failed logins, counted twice: per source and per user name. Each is a
//! leaky bucket that every failure fills by one and that drains at a steady
//! rate; while either bucket of an attempt is over its burst, the login is
//! refused without checking the password — and told so
//! ([`Throttled`]: "too many failed logins from 10.0.0.7; retry in 3 s"),
//! never "wrong password", so a user who typed it right knows to wait.
//!
//! - **Per source** ([`Source`]): an IPv4 address; an IPv6 address by its
//!   /64 (one host usually holds a whole /64, and could otherwise guess from
//!   2^64 addresses); a unix socket's client by its user id (its peer
//!   credentials), so that one local process's guesses do not lock out
//!   every other local client. An attacker who opens connection after
//!   connection guesses no faster than the drain rate.
//! - **Per user name** (any name tried, configured or not, so the throttle
//!   does not tell which exist): an attacker with many source addresses
//!   still makes at most `user.burst` guesses at one user, then
//!   `user.per_sec` a second. The price: such an attacker can keep that
//!   user's logins throttled; the user is told so, and `auth_throttled`
//!   counts it.
//!
//! A login that succeeds empties neither bucket (a valid user must not
//! unlock guessing). Both tables are bounded ([`MAX_SOURCES`],
//! [`MAX_USERS`]; names are kept as keyed hashes of a fixed size): when one
//! is full, drained buckets are forgotten first, then the emptiest is
//! dropped, so spraying sources or user names can neither grow a table nor
//! free the attacker's own lockout.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Sources tracked at most.
pub const MAX_SOURCES: usize = 16_384;
/// User names tracked at most.
pub const MAX_USERS: usize = 4_096;
/// Characters of a user name repeated in a refusal at most.
const NAME_SHOWN: usize = 64;

/// Where a login comes from, as the throttle groups clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// An IPv4 address, or an IPv6 address's /64 (the rest zeroed).
    Ip(IpAddr),
    /// A unix socket's client: its user id.
    Uid(u32),
}

impl Source {
    /// The source of a client at `ip`: IPv4 as is (also when written as an
    /// IPv4-mapped IPv6 address), IPv6 by its /64.
    pub fn ip(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(v4) => Source::Ip(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source::Ip(IpAddr::V4(v4)),
                None => Source::Ip(IpAddr::V6(Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX)))),
            },
        }
    }
}

impl From<IpAddr> for Source {
    fn from(ip: IpAddr) -> Source {
        Source::ip(ip)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Source::Ip(IpAddr::V6(a)) => write!(f, "{a}/64"),
            Source::Uid(uid) => write!(f, "local uid {uid}"),
        }
    }
}

/// A bucket's limits: `burst` failures at once, then `per_sec` a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Failures in a row before logins are refused unchecked.
    pub burst: f64,
    /// Failures per second earned back.
    pub per_sec: f64,
}

/// The limits of both buckets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Per source.
    pub source: Rate,
    /// Per user name.
    pub user: Rate,
}

impl Default for Limits {
    /// A source: 10 failures in a row, then one a second; a user name: 20,
    /// then one a second.
    fn default() -> Self {
        Limits { source: Rate { burst: 10.0, per_sec: 1.0 }, user: Rate { burst: 20.0, per_sec: 1.0 } }
    }
}

/// Why a login was refused unchecked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum By {
    /// Its source failed too often.
    Source(Source),
    /// Its user name failed too often (the name as shown: printable ASCII, cut).
    User(String),
}

/// A login refused unchecked, and when the next one will be checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttled {
    /// Which bucket is full.
    pub by: By,
    /// Whole seconds until an attempt is checked again (at least 1).
    pub retry_secs: u64,
}

impl fmt::Display for Throttled {
    /// `too many failed logins from 10.0.0.7; retry in 3 s` (or `for user alice`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.by {
            By::Source(s) => write!(f, "too many failed logins from {s}; retry in {} s", self.retry_secs),
            By::User(u) => write!(f, "too many failed logins for user {u}; retry in {} s", self.retry_secs),
        }
    }
}

/// A user name as a refusal may repeat it: printable ASCII other than
/// quotes and backslashes (anything else as `?`), at most [`NAME_SHOWN`]
/// characters — it goes into protocol lines and logs.
fn shown_name(name: &[u8]) -> String {
    let mut s: String = name
        .iter()
        .take(NAME_SHOWN)
        .map(|&b| if b.is_ascii_graphic() && !matches!(b, b'"' | b'\'' | b'\\') { b as char } else { '?' })
        .collect();
    if name.len() > NAME_SHOWN {
        s.push_str("...");
    }
    s
}

/// One bucket: its level when last touched.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    level: f64,
    at: Instant,
}

/// Buckets by key, at most `max` of them.
#[derive(Debug)]
struct Table<K> {
    rate: Rate,
    max: usize,
    buckets: Mutex<HashMap<K, Bucket>>,
}

impl<K: Eq + Hash + Copy> Table<K> {
    fn new(rate: Rate, max: usize) -> Table<K> {
        Table { rate, max, buckets: Mutex::new(HashMap::new()) }
    }

    fn level(&self, b: &Bucket, now: Instant) -> f64 {
        (b.level - now.saturating_duration_since(b.at).as_secs_f64() * self.rate.per_sec).max(0.0)
    }

    /// `None` when an attempt for `key` may be checked now; else the whole
    /// seconds until one may.
    fn wait(&self, key: &K, now: Instant) -> Option<u64> {
        let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let over = buckets.get(key).map(|b| self.level(b, now) + 1.0 - self.rate.burst).filter(|&o| o > 0.0)?;
        let secs = if self.rate.per_sec > 0.0 { (over / self.rate.per_sec).ceil() } else { f64::from(u32::MAX) };
        Some((secs as u64).max(1))
    }

    fn failed(&self, key: K, now: Instant) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= self.max && !buckets.contains_key(&key) {
            buckets.retain(|_, b| self.level(b, now) > 0.0);
            if buckets.len() >= self.max {
                let emptiest = buckets
                    .iter()
                    .min_by(|a, b| self.level(a.1, now).total_cmp(&self.level(b.1, now)))
                    .map(|(k, _)| *k);
                if let Some(k) = emptiest {
                    buckets.remove(&k);
                }
            }
        }
        let level = buckets.get(&key).map_or(0.0, |b| self.level(b, now));
        buckets.insert(key, Bucket { level: level + 1.0, at: now });
    }

    fn len(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Failed logins by source and by user name.
#[derive(Debug)]
pub struct Throttle {
    sources: Table<Source>,
    users: Table<u64>,
    /// The key of the names' hashes (random per process: nobody can aim
    /// two names at one bucket).
    names: std::collections::hash_map::RandomState,
    /// Attempts refused unchecked (their source or user name was locked out).
    pub refused: AtomicU64,
}

impl Throttle {
    /// A throttle with these limits.
    pub fn new(limits: Limits) -> Throttle {
        Throttle {
            sources: Table::new(limits.source, MAX_SOURCES),
            users: Table::new(limits.user, MAX_USERS),
            names: Default::default(),
            refused: AtomicU64::new(0),
        }
    }

    /// Whether a login from `source` as `user` (either unknown: not
    /// counted) may be checked now; a refusal is counted and says why.
    pub fn check(&self, source: Option<Source>, user: Option<&[u8]>) -> Result<(), Throttled> {
        let now = Instant::now();
        let by_source = source.and_then(|s| self.sources.wait(&s, now).map(|w| (By::Source(s), w)));
        let by_user =
            || user.and_then(|u| self.users.wait(&self.names.hash_one(u), now).map(|w| (By::User(shown_name(u)), w)));
        match by_source.or_else(by_user) {
            None => Ok(()),
            Some((by, retry_secs)) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(Throttled { by, retry_secs })
            }
        }
    }

    /// A login from `source` as `user` failed (it was checked).
    pub fn failed(&self, source: Option<Source>, user: Option<&[u8]>) {
        let now = Instant::now();
        if let Some(s) = source {
            self.sources.failed(s, now);
        }
        if let Some(u) = user {
            self.users.failed(self.names.hash_one(u), now);
        }
    }

    /// Sources and user names tracked now.
    pub fn tracked(&self) -> (usize, usize) {
        (self.sources.len(), self.users.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits(burst: f64, per_sec: f64) -> Limits {
        Limits { source: Rate { burst, per_sec }, user: Rate { burst: 1000.0, per_sec: 1000.0 } }
    }

    fn ip(text: &str) -> Option<Source> {
        Some(Source::ip(text.parse().unwrap()))
    }

    #[test]
    fn a_source_is_locked_out_after_its_burst_and_earns_attempts_back() {
        let t = Throttle::new(limits(3.0, 20.0));
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        for _ in 0..3 {
            assert!(t.check(a, None).is_ok());
            t.failed(a, None);
        }
        let refused = t.check(a, None).unwrap_err();
        assert_eq!(refused.to_string(), "too many failed logins from 10.0.0.1; retry in 1 s");
        assert!(t.check(b, None).is_ok(), "another address is not");
        std::thread::sleep(Duration::from_millis(80));
        assert!(t.check(a, None).is_ok(), "one attempt earned back after 1/20 s");
        t.failed(a, None);
        assert!(t.check(a, None).is_err());
        assert_eq!(t.refused.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn the_wait_is_what_the_bucket_needs_to_drain() {
        let t = Throttle::new(limits(2.0, 0.5));
        for _ in 0..5 {
            t.failed(ip("10.0.0.1"), None);
        }
        // Level 5, burst 2, half an attempt a second: (5 + 1 - 2) / 0.5 = 8 s.
        let w = t.check(ip("10.0.0.1"), None).unwrap_err().retry_secs;
        assert!((7..=8).contains(&w), "{w}");
    }

    #[test]
    fn ipv6_is_grouped_by_its_64_and_mapped_ipv4_is_ipv4() {
        assert_eq!(ip("2001:db8:1:2:aaaa::1"), ip("2001:db8:1:2:ffff:1:2:3"));
        assert_ne!(ip("2001:db8:1:2::1"), ip("2001:db8:1:3::1"));
        assert_eq!(ip("2001:db8:1:2:aaaa::1").unwrap().to_string(), "2001:db8:1:2::/64");
        assert_eq!(ip("::ffff:192.0.2.7"), ip("192.0.2.7"));
        assert_ne!(ip("192.0.2.7"), ip("192.0.2.8"), "IPv4 by address");
        let t = Throttle::new(limits(2.0, 0.001));
        t.failed(ip("2001:db8::1"), None);
        t.failed(ip("2001:db8::2"), None);
        let refused = t.check(ip("2001:db8::ffff:3"), None).unwrap_err();
        assert_eq!(refused.by, By::Source(ip("2001:db8::").unwrap()));
        assert!(refused.to_string().starts_with("too many failed logins from 2001:db8::/64; retry in "));
        assert!(t.check(ip("2001:db8:0:1::1"), None).is_ok(), "the next /64 is another source");
    }

    #[test]
    fn unix_clients_are_bucketed_by_uid() {
        let t = Throttle::new(limits(2.0, 0.001));
        t.failed(Some(Source::Uid(1000)), None);
        t.failed(Some(Source::Uid(1000)), None);
        let refused = t.check(Some(Source::Uid(1000)), None).unwrap_err();
        assert_eq!(refused.by, By::Source(Source::Uid(1000)));
        assert!(refused.to_string().contains("from local uid 1000"), "{refused}");
        assert!(t.check(Some(Source::Uid(1001)), None).is_ok(), "another local user is not locked out");
        assert!(t.check(ip("127.0.0.1"), None).is_ok(), "nor loopback TCP clients");
    }

    #[test]
    fn a_user_name_is_locked_out_whatever_the_sources() {
        let t = Throttle::new(Limits {
            source: Rate { burst: 10.0, per_sec: 0.001 },
            user: Rate { burst: 5.0, per_sec: 0.001 },
        });
        let mut checked = 0;
        for i in 0..200u32 {
            let source = Some(Source::ip(IpAddr::from(std::net::Ipv4Addr::from(0x7f00_0001 + i % 50))));
            if t.check(source, Some(b"alice")).is_ok() {
                checked += 1;
                t.failed(source, Some(b"alice"));
            }
        }
        assert_eq!(checked, 5, "the user's burst, across 50 addresses");
        let refused = t.check(ip("127.0.0.99"), Some(b"alice")).unwrap_err();
        assert_eq!(refused.by, By::User("alice".into()));
        assert!(t.check(ip("127.0.0.99"), Some(b"bob")).is_ok(), "another user is not");
        assert_eq!(shown_name(b"a\r\n-ERR x \"y\""), "a??-ERR?x??y?", "nothing that breaks a protocol line");
        assert!(shown_name(&[b'x'; 300]).ends_with("..."));
    }

    #[test]
    fn the_tables_stay_bounded_and_keep_the_worst_offenders() {
        let t = Throttle::new(Limits {
            source: Rate { burst: 2.0, per_sec: 0.001 },
            user: Rate { burst: 2.0, per_sec: 0.001 },
        });
        let attacker = ip("192.0.2.1");
        t.failed(attacker, Some(b"victim"));
        t.failed(attacker, Some(b"victim"));
        for i in 0..(MAX_SOURCES as u32 + 500) {
            let name = format!("sprayed-{i}");
            t.failed(Some(Source::ip(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)))), Some(name.as_bytes()));
        }
        let (sources, users) = t.tracked();
        assert!(sources <= MAX_SOURCES && users <= MAX_USERS, "{sources} {users}");
        assert!(t.check(attacker, None).is_err(), "spraying from other addresses does not free the attacker's");
        assert!(t.check(None, Some(b"victim")).is_err(), "spraying names does not free the victim's lockout");
    }
}
