//! The queue of logins for the login threads (`worker::run_login_thread`),
//! where passwords are checked, so that no worker ever spends an argon2 hash
//! (tens of milliseconds, 19 MiB) while other clients' requests wait, and
//! memory stays bounded whatever attackers send; and the check itself
//! ([`check`]), which the async engine's blocking threads and `/ui` use too.
//!
//! A worker that meets `AUTH` or `HELLO ... AUTH` looks at the cheap things
//! first (the connection's wait, the failures remembered, the source
//! address's and the user name's throttles, `Throttle::check`), then hands
//! the request to a bounded queue of logins and goes on with other work. A
//! login thread — `[auth] login_threads` of them, each with one argon2 memory
//! block it keeps (`users::Verifier`) — takes the throttle's charge
//! (`Throttle::begin`: the attempt counts as failed until it proves right),
//! checks the password and puts the request back on the request queue with
//! the outcome, where a worker answers it as any other. Logins waiting in
//! the queue hold no charge (a fleet of clients logging in at once with the
//! right password is not throttled), and none is checked without one (the
//! checked guesses at a user are bounded as the throttle says, however many
//! wait). When the logins queue is full the login is answered `-TRYAGAIN`
//! at once.

use std::net::IpAddr;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use mwserve::throttle::{Attempt, Refused, Source, Throttle};

use crate::command::Credentials;
use crate::engine::job::Job;
use crate::users::{Checked, Users, Verifier};

/// The queue of logins waiting for a check.
pub struct Logins {
    tx: Sender<Box<Job>>,
    rx: Receiver<Box<Job>>,
    /// Failed logins by source address and by user name (shared with the
    /// admin endpoint, where a wrong admin token counts too).
    pub throttle: Arc<Throttle>,
}

impl Logins {
    /// A queue of at most `capacity` logins; failures throttled with `limits`.
    pub fn new(capacity: usize, limits: mwserve::throttle::Limits) -> Logins {
        let (tx, rx) = crossbeam_channel::bounded(capacity);
        Logins { tx, rx, throttle: Arc::new(Throttle::new(limits)) }
    }

    /// Hands a login to the login threads; the job back when the queue is full.
    pub fn submit(&self, job: Box<Job>) -> Result<(), Box<Job>> {
        self.tx.try_send(job).map_err(|e| match e {
            TrySendError::Full(j) | TrySendError::Disconnected(j) => j,
        })
    }

    /// Logins waiting for a check.
    pub fn waiting(&self) -> usize {
        self.rx.len()
    }

    /// Where the login threads take logins from (`worker::run_login_thread`).
    pub fn receiver(&self) -> Receiver<Box<Job>> {
        self.rx.clone()
    }
}

/// A login as the throttle sees it: from `peer`, over `via`.
pub fn attempt<'a>(peer: Option<IpAddr>, credentials: &'a Credentials, via: &'static str) -> Attempt<'a> {
    Attempt {
        source: peer.map(Source::ip),
        user: Some(credentials.user.as_bytes()),
        secret: &credentials.password,
        via,
    }
}

/// Checks `credentials` from `peer` against `users` in `memory`, within
/// `throttle`: charged before the hash, the charge given back if right.
pub fn check(
    throttle: &Throttle,
    users: &Users,
    peer: Option<IpAddr>,
    credentials: &Credentials,
    via: &'static str,
    memory: &mut Verifier,
) -> Checked {
    let a = attempt(peer, credentials, via);
    if let Err(refused) = throttle.begin(&a) {
        if refused == Refused::Repeated {
            users.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        return Checked::Refused(refused);
    }
    let user = users.check_with(&credentials.user, &credentials.password, memory);
    throttle.checked(&a, user.is_some());
    user.map_or(Checked::Wrong, Checked::User)
}
