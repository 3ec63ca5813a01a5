//! The queue of logins for the login threads (`worker::run_login_thread`),
//! where passwords are checked, so that no worker ever spends an argon2 hash
//! (tens of milliseconds, 19 MiB) while other clients' requests wait, and
//! memory stays bounded whatever attackers send.
//!
//! A worker that meets `AUTH` or `HELLO ... AUTH` checks the cheap things
//! first (the connection's, the source address's and the user name's throttles), then hands
//! the request to a bounded queue of logins and goes on with other work. A
//! login thread — `[auth] login_threads` of them, each with one argon2 memory
//! block it keeps (`users::Verifier`) — checks the password and puts the request
//! back on the request queue with the outcome, where a worker answers it as
//! any other. When the logins queue is full the login is answered
//! `-TRYAGAIN` at once.

use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::job::Job;

/// The queue of logins waiting for a check.
pub struct Logins {
    tx: Sender<Box<Job>>,
    rx: Receiver<Box<Job>>,
    /// Failed logins by source address and by user name.
    pub throttle: mwserve::throttle::Throttle,
}

impl Logins {
    /// A queue of at most `capacity` logins; failures throttled with `limits`.
    pub fn new(capacity: usize, limits: mwserve::throttle::Limits) -> Logins {
        let (tx, rx) = crossbeam_channel::bounded(capacity);
        Logins { tx, rx, throttle: mwserve::throttle::Throttle::new(limits) }
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
