//! The login threads: where passwords are checked, so that no worker ever
//! spends an argon2 hash (tens of milliseconds, 19 MiB) while other clients'
//! requests wait, and memory stays bounded whatever attackers send.
//!
//! A worker that meets `AUTH` or `HELLO ... AUTH` checks the cheap things
//! first (the connection's and the source address's throttles), then hands
//! the request to a bounded queue of logins and goes on with other work. A
//! login thread — `[auth] login_threads` of them, each with one argon2 memory
//! block it keeps ([`Verifier`]) — checks the password and puts the request
//! back on the request queue with the outcome, where a worker answers it as
//! any other. When the logins queue is full the login is answered
//! `-TRYAGAIN` at once.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::command::Command;
use crate::job::{Job, Work};
use crate::shared::Shared;
use crate::users::Verifier;

/// The queue of logins waiting for a check.
pub struct Logins {
    tx: Sender<Box<Job>>,
    rx: Receiver<Box<Job>>,
    /// Failed logins by source address.
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
}

/// A login thread: checks the logins handed to it until mwmq stops.
pub fn run_login_thread(shared: Arc<Shared>) {
    let mut memory = Verifier::default();
    let rx = shared.logins.rx.clone();
    loop {
        let mut job = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(job) => job,
            Err(_) if shared.stopping.load(std::sync::atomic::Ordering::Relaxed) && rx.is_empty() => return,
            Err(_) => continue,
        };
        let credentials = match &job.cmd {
            Ok(Command::Auth(c)) | Ok(Command::Hello { auth: Some(c), .. }) => c,
            _ => unreachable!("only logins are queued here"),
        };
        job.login = Some(shared.users.check_with(&credentials.user, &credentials.password, &mut memory));
        job.t_enqueue = mwstats::clock::now_ns();
        shared.queue.push_again(Work::Request(job));
    }
}
