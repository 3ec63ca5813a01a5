//! Who may use mwmq, and for what: users from the configuration file
//! (`[[users]]`), their passwords as argon2id hashes (PHC strings, made by
//! `mwmq user add`), and per-queue rights — send to, receive from,
//! administer — as patterns where `*` stands for any run of characters.
//!
//! With users configured, a connection is nobody until `AUTH` (or `HELLO 3
//! AUTH`) names a user and the right password; from then on it **is** that
//! user: its messages carry the user's name as their sender, and `TO` names
//! users. Checking a password costs an argon2 hash on purpose (and the same
//! cost for a user who does not exist), paid on the login threads
//! (`logins.rs`), each with one argon2 memory block it keeps ([`Verifier`]);
//! a connection's failed attempts also make it wait (see `Attempts`), and so
//! do its source address's and the user name's (`mwserve::throttle`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::password_hash::{rand_core::OsRng, PasswordHash, PasswordHasher, SaltString};
use argon2::{Argon2, Block, Params, Version};
use serde::{Deserialize, Serialize};

/// A `[[users]]` table of the configuration file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// The user's name: its identity as a sender and a receiver.
    pub name: String,
    /// Its password as an argon2 PHC string (`mwmq user add` makes it).
    pub password_hash: String,
    /// Queues it may send to (patterns; `*` matches any characters).
    #[serde(default)]
    pub send: Vec<String>,
    /// Queues it may receive from (RECV, POP, PEEK, ACK, NACK, TOUCH).
    #[serde(default)]
    pub receive: Vec<String>,
    /// Queues it may create, drop, change and redrive.
    #[serde(default)]
    pub admin: Vec<String>,
    /// Most queues it may have created (and not dropped) at once (default 1000).
    #[serde(default = "default_max_queues")]
    pub max_queues: u64,
    /// Most schedules (QSCHEDULE) it may have created at once (default 100).
    #[serde(default = "default_max_schedules")]
    pub max_schedules: u64,
    /// Largest message body it may send, in bytes (default: the server's `max_body`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body: Option<usize>,
    /// PostgreSQL roles that act as this user when they call `mwmq.send`
    /// and `mwmq.ack` (`sqlguard.rs`); a role belongs to one user at most.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub database_roles: Vec<String>,
}

fn default_max_queues() -> u64 {
    1000
}

fn default_max_schedules() -> u64 {
    100
}

/// What a command does to a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Right {
    /// SEND.
    Send,
    /// RECV, POP, PEEK, ACK, NACK, TOUCH.
    Receive,
    /// QCREATE, QALTER, QDROP, QPAUSE, QRESUME, QARCHIVE, QDEAD, REDRIVE,
    /// QSCHEDULE and QUNSCHEDULE (on the schedule's queue).
    Admin,
    /// QLEN, QINFO: any of the three.
    See,
}

impl Right {
    /// What it lets a user do, as refusals say it ("send to", ...).
    pub fn verb(self) -> &'static str {
        match self {
            Right::Send => "send to",
            Right::Receive => "receive from",
            Right::Admin => "administer",
            Right::See => "see",
        }
    }
}

/// A user, as the running mwmq checks it.
#[derive(Debug)]
pub struct User {
    /// Its name.
    pub name: String,
    hash: String,
    send: Vec<String>,
    receive: Vec<String>,
    admin: Vec<String>,
    /// Most queues it may have created at once.
    pub max_queues: u64,
    /// Most schedules it may have created at once.
    pub max_schedules: u64,
    /// Largest body it may send (`None`: the server's limit).
    pub max_body: Option<usize>,
}

impl User {
    /// Whether it may do `right` on `queue`.
    pub fn may(&self, right: Right, queue: &str) -> bool {
        let any = |patterns: &[String]| patterns.iter().any(|p| matches(p, queue));
        match right {
            Right::Send => any(&self.send),
            Right::Receive => any(&self.receive),
            Right::Admin => any(&self.admin),
            Right::See => any(&self.send) || any(&self.receive) || any(&self.admin),
        }
    }

    /// The patterns of the queues it may administer (for checks the
    /// database makes: a schedule's queue is known only there).
    pub fn admin_patterns(&self) -> &[String] {
        &self.admin
    }

    /// The patterns of the queues it may see (any of its rights): for
    /// listings the database filters (QSCHEDULES).
    pub fn see_patterns(&self) -> Vec<String> {
        self.patterns(Right::See)
    }

    /// The patterns of the queues it may do `right` on (for listings the
    /// database filters: QLIST, QLIST PENDING, QSCHEDULES).
    pub fn patterns(&self, right: Right) -> Vec<String> {
        match right {
            Right::Send => self.send.clone(),
            Right::Receive => self.receive.clone(),
            Right::Admin => self.admin.clone(),
            Right::See => self.send.iter().chain(&self.receive).chain(&self.admin).cloned().collect(),
        }
    }

    /// Redis's refusal of `right` on `queue` for this user.
    pub fn refusal(&self, right: Right, queue: &str) -> String {
        format!("NOPERM User {} has no permissions to {} queue '{}'", self.name, right.verb(), queue)
    }
}

/// `*` matches any run of characters; everything else matches itself.
pub fn matches(pattern: &str, s: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == s;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !s.starts_with(first) || s.len() < first.len() + last.len() || !s.ends_with(last) {
        return false;
    }
    let mut rest = &s[first.len()..s.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

/// The users of a running mwmq.
#[derive(Debug, Default)]
pub struct Users {
    by_name: HashMap<String, Arc<User>>,
    /// A hash to check passwords of unknown users against (the same cost).
    decoy: String,
    /// Failed attempts since start.
    pub failures: AtomicU64,
}

/// The argon2id hash of `password`, as a PHC string, with a fresh salt.
pub fn hash_password(password: &[u8]) -> String {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default().hash_password(password, &salt).expect("argon2 hashes any password").to_string()
}

impl Users {
    /// The users of the configuration; a hash that is not an argon2 PHC
    /// string, an empty or repeated name, or a bad pattern is refused.
    pub fn from_config(users: &[UserConfig]) -> Result<Users, String> {
        let mut by_name = HashMap::new();
        let mut roles: HashMap<&str, &str> = HashMap::new();
        for u in users {
            for r in &u.database_roles {
                // PostgreSQL's names are at most 63 bytes (NAMEDATALEN - 1).
                if r.is_empty() || r.len() > 63 {
                    return Err(format!("users: {}: {r:?} is not a database role (1 to 63 bytes)", u.name));
                }
                if let Some(other) = roles.insert(r, &u.name) {
                    return Err(format!(
                        "users: the database role {r} is in the database_roles of {other} and {}",
                        u.name
                    ));
                }
            }
            if u.name.is_empty() || u.name.len() > crate::command::MAX_NAME || u.name.contains(char::is_whitespace) {
                return Err(format!("users: {:?} is not a user name (1 to 200 characters, no spaces)", u.name));
            }
            match PasswordHash::new(&u.password_hash) {
                Ok(h) if h.algorithm.as_str().starts_with("argon2") => {}
                _ => {
                    return Err(format!(
                        "users: {}: password_hash is not an argon2 hash (make one with `mwmq user add {} \
                         --password-stdin`)",
                        u.name, u.name
                    ))
                }
            }
            for p in u.send.iter().chain(&u.receive).chain(&u.admin) {
                if p.is_empty() || p.len() > crate::command::MAX_NAME {
                    return Err(format!("users: {}: {p:?} is not a queue pattern", u.name));
                }
            }
            let user = User {
                name: u.name.clone(),
                hash: u.password_hash.clone(),
                send: u.send.clone(),
                receive: u.receive.clone(),
                admin: u.admin.clone(),
                max_queues: u.max_queues,
                max_schedules: u.max_schedules,
                max_body: u.max_body,
            };
            if by_name.insert(u.name.clone(), Arc::new(user)).is_some() {
                return Err(format!("users: {} is configured twice", u.name));
            }
        }
        let decoy = if by_name.is_empty() { String::new() } else { hash_password(b"not anyone's password") };
        Ok(Users { by_name, decoy, failures: AtomicU64::new(0) })
    }

    /// Whether any user is configured (then every connection must log in).
    pub fn enabled(&self) -> bool {
        !self.by_name.is_empty()
    }

    /// The user named `name`, if it is one (no password checked: for what
    /// acts on a user's behalf later, as a schedule's ticks do).
    pub fn get(&self, name: &str) -> Option<&Arc<User>> {
        self.by_name.get(name)
    }

    /// The user `name` if `password` is its password (counted when not),
    /// hashed in `memory`.
    pub fn check_with(&self, name: &str, password: &[u8], memory: &mut Verifier) -> Option<Arc<User>> {
        let user = self.by_name.get(name);
        let hash = user.map_or(self.decoy.as_str(), |u| u.hash.as_str());
        if memory.verify(hash, password) && user.is_some() {
            return user.cloned();
        }
        self.failures.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// [`Users::check_with`] in memory of its own.
    pub fn check(&self, name: &str, password: &[u8]) -> Option<Arc<User>> {
        self.check_with(name, password, &mut Verifier::default())
    }
}

/// A login's outcome (`logins::check`).
#[derive(Clone)]
pub enum Checked {
    /// The password is the user's.
    User(Arc<User>),
    /// It is not (checked).
    Wrong,
    /// Refused unchecked: the same password failed lately, or the source or
    /// the user name is throttled.
    Refused(mwserve::throttle::Refused),
}

/// Checks passwords against argon2 PHC hashes in one block of memory kept
/// from check to check (as large as the largest hash checked needs), so a
/// login thread's memory does not grow with the logins it checks.
#[derive(Default)]
pub struct Verifier {
    blocks: Vec<Block>,
}

impl Verifier {
    /// Whether `password` hashes to the PHC string `phc` (compared in constant time).
    pub fn verify(&mut self, phc: &str, password: &[u8]) -> bool {
        let Ok(h) = PasswordHash::new(phc) else { return false };
        let (Ok(algorithm), Ok(params), Some(expected), Some(salt)) =
            (argon2::Algorithm::try_from(h.algorithm), Params::try_from(&h), h.hash, h.salt)
        else {
            return false;
        };
        let version = h.version.map_or(Ok(Version::V0x13), Version::try_from);
        let mut salt_buf = [0u8; 64];
        let (Ok(version), Ok(salt)) = (version, salt.decode_b64(&mut salt_buf)) else { return false };
        let n = params.block_count();
        if self.blocks.len() < n {
            self.blocks.resize(n, Block::default());
        }
        let mut out = vec![0u8; expected.len()];
        let argon = Argon2::new(algorithm, version, params);
        if argon.hash_password_into_with_memory(password, salt, &mut out, &mut self.blocks[..n]).is_err() {
            return false;
        }
        out.iter().zip(expected.as_bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    /// Bytes of argon2 memory it holds.
    pub fn held(&self) -> usize {
        self.blocks.len() * std::mem::size_of::<Block>()
    }
}

/// One connection's failed logins: after the n-th, the next attempt is not
/// even checked before 100 ms × 2^(n-1) (at most 5 s) have passed, so a
/// connection tries at most a handful of passwords a second, and fewer and
/// fewer.
#[derive(Debug, Default)]
pub struct Attempts(Mutex<(u32, Option<Instant>)>);

impl Attempts {
    /// Whether an attempt may be checked now.
    pub fn may_try(&self) -> bool {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        !matches!(g.1, Some(until) if Instant::now() < until)
    }

    /// `None` when an attempt may be checked now; else the whole seconds
    /// (at least 1) until one may.
    pub fn wait(&self) -> Option<u64> {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let left = g.1?.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
        Some(left.as_secs_f64().ceil().max(1.0) as u64)
    }

    /// An attempt failed.
    pub fn failed(&self) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.0 = g.0.saturating_add(1);
        let wait = Duration::from_millis(100u64 << (g.0 - 1).min(6)).min(Duration::from_secs(5));
        g.1 = Some(Instant::now() + wait);
    }

    /// An attempt succeeded.
    pub fn succeeded(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = (0, None);
    }
}

/// `mwmq user add NAME --password-stdin [--send P]... [--receive P]... [--admin P]...`:
/// the `[[users]]` table to append to the configuration file, or why not.
pub fn user_table(
    name: &str,
    password: &[u8],
    send: &[String],
    receive: &[String],
    admin: &[String],
) -> Result<String, String> {
    let u = UserConfig {
        name: name.into(),
        password_hash: hash_password(password),
        send: send.to_vec(),
        receive: receive.to_vec(),
        admin: admin.to_vec(),
        max_queues: default_max_queues(),
        max_schedules: default_max_schedules(),
        max_body: None,
        database_roles: Vec::new(),
    };
    Users::from_config(std::slice::from_ref(&u))?;
    let mut doc = toml::Table::new();
    doc.insert("users".into(), toml::Value::Array(vec![toml::Value::try_from(&u).map_err(|e| e.to_string())?]));
    toml::to_string(&doc).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        assert!(matches("orders", "orders"));
        assert!(!matches("orders", "orders2"));
        assert!(matches("*", "anything"));
        assert!(matches("orders.*", "orders.eu"));
        assert!(!matches("orders.*", "order"));
        assert!(matches("a*b*c", "axxbyyc"));
        assert!(!matches("a*b*c", "axxcyyb"));
        assert!(matches("*-dlq", "jobs-dlq"));
    }

    #[test]
    fn users_log_in_and_have_their_rights_only() {
        let table = user_table("alice", b"s3cret", &["orders.*".into()], &["inbox".into()], &[]).unwrap();
        let doc: toml::Table = toml::from_str(&table).unwrap();
        let cfg: Vec<UserConfig> = doc["users"].clone().try_into().unwrap();
        let users = Users::from_config(&cfg).unwrap();
        assert!(users.enabled());
        let alice = users.check("alice", b"s3cret").expect("right password");
        assert!(users.check("alice", b"wrong").is_none());
        assert!(users.check("mallory", b"s3cret").is_none());
        assert_eq!(users.failures.load(Ordering::Relaxed), 2);
        // One verifier's memory: one argon2 block set, however many checks.
        let mut v = Verifier::default();
        for _ in 0..3 {
            assert!(users.check_with("alice", b"s3cret", &mut v).is_some());
            assert!(users.check_with("alice", b"s3cres", &mut v).is_none());
        }
        assert_eq!(v.held(), 19_456 * 1024, "argon2's default 19 MiB, kept");
        assert!(alice.may(Right::Send, "orders.eu") && !alice.may(Right::Send, "inbox"));
        assert!(alice.may(Right::Receive, "inbox") && !alice.may(Right::Admin, "inbox"));
        assert!(alice.may(Right::See, "inbox") && !alice.may(Right::See, "payroll"));
        let mut bad = cfg.clone();
        bad[0].password_hash = "plaintext".into();
        assert!(Users::from_config(&bad).unwrap_err().contains("argon2"));
        bad = vec![cfg[0].clone(), cfg[0].clone()];
        assert!(Users::from_config(&bad).unwrap_err().contains("twice"));
        // A database role acts as one user at most.
        bad[0].database_roles = vec!["app".into()];
        bad[1].name = "bob".into();
        bad[1].database_roles = vec!["app".into()];
        assert!(Users::from_config(&bad).unwrap_err().contains("database_roles of alice and bob"));
        bad[1].database_roles = vec!["x".repeat(64)];
        assert!(Users::from_config(&bad).unwrap_err().contains("not a database role"));
    }

    #[test]
    fn failed_attempts_make_a_connection_wait() {
        let a = Attempts::default();
        assert!(a.may_try());
        a.failed();
        assert!(!a.may_try(), "not at once after a failure");
        a.succeeded();
        assert!(a.may_try());
    }
}
