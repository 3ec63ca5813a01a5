//! Failed logins, counted twice: per source and per user name. Each is a
//! leaky bucket that every failure fills by one and that drains at a steady
//! rate; while either bucket of an attempt is full (at its burst), the login
//! is refused without checking the password — and told so
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
//! **The charge comes before the check** ([`Throttle::begin`]): an attempt
//! about to be checked fills both buckets at once, atomically, and the
//! charge is given back only if the password was right
//! ([`Throttle::checked`]). So attempts checked at the same time (several
//! login threads, a queue of logins) cannot pass a bucket that has room for
//! one: the checked guesses at a user in `t` seconds are at most `burst +
//! per_sec × t`, and a bucket never holds more than its burst, so the user
//! waits at most `1 / per_sec` s once an attack stops. A login that succeeds
//! empties neither bucket beyond its own charge (a valid user must not
//! unlock guessing).
//!
//! **A failure repeated is not counted again** ([`remembered`]): the same
//! password from the same source for the same user, failed within
//! [`REPEAT_WINDOW`], is refused at once as wrong without a check and
//! without a charge — a misconfigured client retrying (redis-py retries a
//! failed login) no longer locks its host out. Only keyed hashes of the
//! triples are kept, never a password; [`Throttle::forget_failures`] clears
//! them when the passwords may have changed (a reload).
//!
//! **Failures are logged** ([`report`]) at warn, with the source and the user
//! name (never the password), one line per source per [`LOG_EVERY`] with a
//! count of those not logged.
//!
//! Every table is bounded ([`MAX_SOURCES`], [`MAX_USERS`],
//! [`remembered::MAX_REMEMBERED`]; names are kept as keyed hashes of a
//! fixed size): when one is full, drained buckets are forgotten first, then
//! the emptiest is dropped, so spraying sources or user names can neither
//! grow a table nor free the attacker's own lockout.

mod remembered;
mod report;

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

pub use remembered::{MAX_REMEMBERED, REPEAT_WINDOW};
pub use report::LOG_EVERY;

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

/// A login attempt as the throttle sees it.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    /// Where it comes from (`None`: unknown, counted in no source's bucket).
    pub source: Option<Source>,
    /// The user name it names (`None`: none, as with the admin token).
    pub user: Option<&'a [u8]>,
    /// The password (or token) offered: hashed to recognise a repeat, never kept.
    pub secret: &'a [u8],
    /// What it logs in to (`AUTH`, `/ui`, `SASL`, `the admin token`), for the log.
    pub via: &'static str,
}

/// Why an attempt was refused without its password being checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The same password from the same source for the same user failed less
    /// than [`REPEAT_WINDOW`] ago: it is still wrong. Answered as any wrong
    /// password; not counted again.
    Repeated,
    /// A bucket of the attempt is full: told so, never "wrong password".
    Throttled(Throttled),
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

    fn lock(&self) -> MutexGuard<'_, HashMap<K, Bucket>> {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn level(&self, b: &Bucket, now: Instant) -> f64 {
        (b.level - now.saturating_duration_since(b.at).as_secs_f64() * self.rate.per_sec).max(0.0)
    }

    /// `None` when the bucket of `key` has room for one more attempt now;
    /// else the whole seconds until it has.
    fn wait(&self, buckets: &HashMap<K, Bucket>, key: &K, now: Instant) -> Option<u64> {
        let over = buckets.get(key).map(|b| self.level(b, now) + 1.0 - self.rate.burst).filter(|&o| o > 0.0)?;
        let secs = if self.rate.per_sec > 0.0 { (over / self.rate.per_sec).ceil() } else { f64::from(u32::MAX) };
        Some((secs as u64).max(1))
    }

    /// Fills the bucket of `key` by `by` (never below empty); a new key
    /// makes room in a full table first.
    fn add(&self, buckets: &mut HashMap<K, Bucket>, key: K, by: f64, now: Instant) {
        if by <= 0.0 && !buckets.contains_key(&key) {
            return;
        }
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
        buckets.insert(key, Bucket { level: (level + by).max(0.0), at: now });
    }
}

/// Failed logins by source and by user name, the failures recently seen,
/// and their log.
#[derive(Debug)]
pub struct Throttle {
    sources: Table<Source>,
    users: Table<u64>,
    /// The key of the names' hashes (random per process: nobody can aim
    /// two names at one bucket).
    names: std::collections::hash_map::RandomState,
    remembered: remembered::Remembered,
    report: report::Report,
    /// Attempts refused unchecked (their source or user name was locked out).
    pub refused: AtomicU64,
    /// Attempts refused as wrong unchecked: the same password failed lately.
    pub repeated: AtomicU64,
}

impl Throttle {
    /// A throttle with these limits.
    pub fn new(limits: Limits) -> Throttle {
        Throttle {
            sources: Table::new(limits.source, MAX_SOURCES),
            users: Table::new(limits.user, MAX_USERS),
            names: Default::default(),
            remembered: remembered::Remembered::default(),
            report: report::Report::default(),
            refused: AtomicU64::new(0),
            repeated: AtomicU64::new(0),
        }
    }

    /// Whether `a` would be checked now, charging nothing: a cheap look
    /// before a login waits for its check (the check itself calls
    /// [`Throttle::begin`]). A refusal is counted and logged.
    pub fn check(&self, a: &Attempt) -> Result<(), Refused> {
        self.admit(a, false, Instant::now())
    }

    /// `a`'s password is about to be checked: unless refused, the attempt
    /// is counted as a failure in both its buckets from now on, and
    /// [`Throttle::checked`] must follow with the outcome. A refusal is
    /// counted and logged.
    pub fn begin(&self, a: &Attempt) -> Result<(), Refused> {
        self.admit(a, true, Instant::now())
    }

    /// The outcome of an attempt [`Throttle::begin`] let through: a right
    /// password gets its charge back; a wrong one keeps it, is remembered
    /// (a repeat within [`REPEAT_WINDOW`] is refused unchecked) and logged.
    pub fn checked(&self, a: &Attempt, right: bool) {
        if right {
            self.charge(a, -1.0, Instant::now());
        } else {
            self.remembered.remember(a);
            self.report.failed(a, &"wrong password");
        }
    }

    /// Forgets the failed passwords remembered: the next attempt with any
    /// of them is checked again (after a reload that may change passwords).
    pub fn forget_failures(&self) {
        self.remembered.clear();
    }

    /// [`Throttle::check`] (`take` false) or [`Throttle::begin`] (true) at
    /// the time `now` (the tests' clock).
    fn admit(&self, a: &Attempt, take: bool, now: Instant) -> Result<(), Refused> {
        if self.remembered.contains(a) {
            self.repeated.fetch_add(1, Ordering::Relaxed);
            self.report.failed(a, &"the same wrong password again (not checked)");
            return Err(Refused::Repeated);
        }
        let user = a.user.map(|u| self.names.hash_one(u));
        // Both buckets looked at and filled under their locks (always
        // sources first): attempts begun at once cannot share one room.
        let mut sources = self.sources.lock();
        let mut users = self.users.lock();
        let by_source = a.source.and_then(|s| self.sources.wait(&sources, &s, now).map(|w| (By::Source(s), w)));
        let by_user = || {
            let (u, name) = (user?, a.user?);
            self.users.wait(&users, &u, now).map(|w| (By::User(shown_name(name)), w))
        };
        match by_source.or_else(by_user) {
            None => {
                if take {
                    if let Some(s) = a.source {
                        self.sources.add(&mut sources, s, 1.0, now);
                    }
                    if let Some(u) = user {
                        self.users.add(&mut users, u, 1.0, now);
                    }
                }
                Ok(())
            }
            Some((by, retry_secs)) => {
                drop((sources, users));
                self.refused.fetch_add(1, Ordering::Relaxed);
                let t = Throttled { by, retry_secs };
                self.report.failed(a, &format_args!("refused unchecked: {t}"));
                Err(Refused::Throttled(t))
            }
        }
    }

    fn charge(&self, a: &Attempt, by: f64, now: Instant) {
        if let Some(s) = a.source {
            self.sources.add(&mut self.sources.lock(), s, by, now);
        }
        if let Some(u) = a.user {
            let key = self.names.hash_one(u);
            self.users.add(&mut self.users.lock(), key, by, now);
        }
    }

    /// Sources and user names tracked now.
    pub fn tracked(&self) -> (usize, usize) {
        (self.sources.lock().len(), self.users.lock().len())
    }
}

#[cfg(test)]
mod tests;
