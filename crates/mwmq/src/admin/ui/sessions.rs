//! The `/ui` page's sessions: random ids handed out at login, each with its
//! owner (a user's name, or the admin token) and what that login may do.
//!
//! A session ends after [`IDLE`] unused, [`LIFETIME`] in all, or at logout.
//! The table is bounded twice, so that no user can end another's session:
//!
//! - **per owner**, at most [`MAX_PER_OWNER`]: a ninth login of the same
//!   user ends that user's least recently used session (logging in again and
//!   again only ever costs the one who does it);
//! - **in all**, at most [`MAX_SESSIONS`]: when that many are open (of at
//!   least `MAX_SESSIONS / MAX_PER_OWNER` different owners), a new login is
//!   refused ([`Full`]) rather than ending someone else's session.

use std::collections::HashMap;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::users::{User, Verifier};

/// A session unused this long ends.
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// A session ends this long after its login, used or not.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions open at most.
pub const MAX_SESSIONS: usize = 64;
/// Sessions one owner (a user, or the admin token's holders) has at most.
pub const MAX_PER_OWNER: usize = 8;

struct Sess<L> {
    owner: String,
    login: L,
    started: Instant,
    used: Instant,
}

/// Sessions by id.
pub struct Sessions<L> {
    table: Mutex<HashMap<String, Sess<L>>>,
}

impl<L> Default for Sessions<L> {
    fn default() -> Self {
        Sessions { table: Mutex::new(HashMap::new()) }
    }
}

/// Every session is taken, by others than the one logging in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "every /ui session ({MAX_SESSIONS}) is taken by other users: try again when one logs out or stays \
             unused for {} minutes",
            IDLE.as_secs() / 60
        )
    }
}

impl<L: Clone> Sessions<L> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sess<L>>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether no session is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sessions open now.
    pub fn len(&self) -> usize {
        let mut s = self.lock();
        expire(&mut s, Instant::now());
        s.len()
    }

    /// Opens session `id` for `owner`: past [`MAX_PER_OWNER`] the owner's
    /// least recently used session ends; [`Full`] when every session is
    /// another owner's.
    pub fn open(&self, id: String, owner: &str, login: L) -> Result<(), Full> {
        let now = Instant::now();
        let mut s = self.lock();
        expire(&mut s, now);
        let own: Vec<(&String, Instant)> =
            s.iter().filter(|(_, v)| v.owner == owner).map(|(k, v)| (k, v.used)).collect();
        if own.len() >= MAX_PER_OWNER || (s.len() >= MAX_SESSIONS && !own.is_empty()) {
            let oldest = own.iter().min_by_key(|(_, used)| *used).map(|(k, _)| (*k).clone());
            if let Some(k) = oldest {
                s.remove(&k);
            }
        } else if s.len() >= MAX_SESSIONS {
            return Err(Full);
        }
        s.insert(id, Sess { owner: owner.to_string(), login, started: now, used: now });
        Ok(())
    }

    /// The login of session `id`, if it is open (it counts as used now).
    pub fn get(&self, id: &str) -> Option<L> {
        let now = Instant::now();
        let mut s = self.lock();
        expire(&mut s, now);
        let sess = s.get_mut(id)?;
        sess.used = now;
        Some(sess.login.clone())
    }

    /// Ends session `id`.
    pub fn close(&self, id: &str) {
        self.lock().remove(id);
    }
}

fn expire<L>(s: &mut HashMap<String, Sess<L>>, now: Instant) {
    s.retain(|_, v| now.duration_since(v.used) < IDLE && now.duration_since(v.started) < LIFETIME);
}

/// Who a session is.
#[derive(Clone)]
pub enum Login {
    /// Nobody logged in, and no login configured: figures only.
    Nobody,
    /// The admin token's holder: every right.
    Token,
    /// A user: its rights.
    User(Arc<User>),
}

impl Login {
    /// The name the page shows for it.
    pub fn name(&self) -> Option<String> {
        match self {
            Login::Nobody => None,
            Login::Token => Some("admin token".into()),
            Login::User(u) => Some(u.name.clone()),
        }
    }

    /// Whose sessions it counts among (the token's holders are one owner;
    /// no user name can be taken for it).
    fn owner(&self) -> String {
        match self {
            Login::Nobody => String::new(),
            Login::Token => "\0token".into(),
            Login::User(u) => format!("user {}", u.name),
        }
    }
}

/// The page's sessions and its password checker.
#[derive(Default)]
pub struct Ui {
    sessions: Sessions<Login>,
    /// Checks passwords, one at a time.
    pub verifier: Mutex<Verifier>,
}

/// A command's refusal or failure as the page gets it.
pub struct Refused(pub u16, pub String);

impl Ui {
    /// Sessions open now (for tests and memory checks).
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// A new session for `login` (its owner's oldest may end; refused when
    /// every session is another owner's).
    pub fn open(&self, login: Login) -> Result<String, Refused> {
        let id = random_hex(32).map_err(|e| Refused(503, format!("no randomness for a session: {e}")))?;
        let owner = login.owner();
        self.sessions.open(id.clone(), &owner, login).map_err(|full| Refused(503, full.to_string()))?;
        Ok(id)
    }

    /// The login of session `id`, if it is open (its use counts).
    pub fn session(&self, id: &str) -> Option<Login> {
        self.sessions.get(id)
    }

    /// Ends session `id` (logout).
    pub fn close(&self, id: &str) {
        self.sessions.close(id);
    }
}

/// `n` bytes from the kernel's random source, in hex.
fn random_hex(n: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_logging_in_again_and_again_ends_only_its_own_sessions() {
        let s: Sessions<u32> = Sessions::default();
        s.open("admin".into(), "boss", 1).unwrap();
        for i in 0..100 {
            s.open(format!("w{i}"), "worker", 2).unwrap();
        }
        assert_eq!(s.get("admin"), Some(1), "the admin's session outlives another user's 100 logins");
        assert_eq!(s.len(), 1 + MAX_PER_OWNER);
        assert!(s.get("w0").is_none(), "the worker's oldest went");
        assert_eq!(s.get("w99"), Some(2));
    }

    #[test]
    fn a_full_table_refuses_a_newcomer_and_lets_an_owner_replace_its_own() {
        let s: Sessions<u32> = Sessions::default();
        let owners = MAX_SESSIONS / MAX_PER_OWNER;
        for o in 0..owners {
            for i in 0..MAX_PER_OWNER {
                s.open(format!("{o}-{i}"), &format!("user{o}"), 0).unwrap();
            }
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        assert_eq!(s.open("new".into(), "newcomer", 0), Err(Full), "nobody else's session ends");
        assert!(Full.to_string().contains("taken by other users"));
        s.get("0-0");
        s.open("again".into(), "user0", 0).unwrap();
        assert_eq!(s.len(), MAX_SESSIONS);
        assert!(s.get("0-1").is_none() && s.get("0-0").is_some(), "user0's least recently used went");
        for o in 1..owners {
            assert!(s.get(&format!("{o}-0")).is_some(), "other users keep theirs");
        }
        s.close("again");
        s.open("new".into(), "newcomer", 0).unwrap();
    }

    #[test]
    fn idle_and_old_sessions_end() {
        let s: Sessions<u32> = Sessions::default();
        s.open("a".into(), "u", 0).unwrap();
        s.open("b".into(), "u", 0).unwrap();
        let Some(long_ago) = Instant::now().checked_sub(LIFETIME + Duration::from_secs(1)) else { return };
        {
            let mut t = s.lock();
            t.get_mut("a").unwrap().used = long_ago;
            t.get_mut("b").unwrap().started = long_ago;
        }
        assert!(s.get("a").is_none() && s.get("b").is_none());
        assert_eq!(s.len(), 0);
    }
}
