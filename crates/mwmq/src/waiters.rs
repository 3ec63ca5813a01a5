//! Long polls: a `RECV ... WAIT ms` (or `XREAD`/`XREADGROUP ... BLOCK`) that
//! finds nothing does not hold a worker. The worker parks the request here
//! and takes other work; a parked request goes back to the request queue when
//! its queue may have a message for it (a SEND committed here, another
//! process's notification, the shared poll, the end of its wait: see
//! `events.rs` and `poller.rs`, whose threads drive it). The async engine's
//! waits are not parked here but say what they wait for ([`Waiters::watch`])
//! and listen to the [`Waiters::bell`].
//!
//! A wake-up that comes between a RECV finding nothing and its parking is
//! not lost: each queue has a sequence number of wake-ups, read before the
//! RECV and checked when parking.
//!
//! Wake-ups come in two strengths. A SEND, XADD or queue drop of this
//! process wakes every waiter of its name ([`Waiters::wake`]). What the
//! shared poll found, and what another process's notification made it look
//! for ([`Waiters::hint`]: a notification is a hint, not a wake-up, since any
//! role that can log in to the database may send one), rings at most as many
//! waiters as it found messages or entries for ([`Waiters::ring`]), the
//! oldest first; the others stay parked.
//!
//! A parked request whose client left is dropped at once
//! ([`Waiters::forget`]), without a statement; one that is parked after its
//! client left is refused.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use mwserve::queue::WorkQueue;

use crate::command::Command;
use crate::engine::job::{Job, Work};
use crate::xcommand::{GroupRead, ReadFrom, Sid, XCmd};

/// What a waiting request looks for (what the shared poll asks the database
/// about on its behalf): when it may be there, the request looks again.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Interest {
    /// A message of this queue visible now, for anyone or for `me`.
    Queue {
        /// Queue.
        name: String,
        /// Who receives (messages sent TO someone else are not for it).
        me: Option<String>,
    },
    /// An entry of this stream after this id (XREAD).
    After(String, Sid),
    /// An entry of this stream that this consumer group has not had (XREADGROUP `>`).
    Group(String, String),
    /// Anything: look again at every poll (an XREAD whose `$` is not resolved
    /// yet, because its first look failed).
    Any(String),
}

impl Interest {
    /// The queue or stream it is about.
    pub fn name(&self) -> &str {
        match self {
            Interest::Queue { name, .. }
            | Interest::After(name, _)
            | Interest::Group(name, _)
            | Interest::Any(name) => name,
        }
    }
}

/// Which waiters of a name a look rings, and how many ([`Waiters::ring`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// The queue or stream.
    pub name: String,
    /// Who of its waiters.
    pub who: Who,
    /// At most this many (`usize::MAX`: all).
    pub n: usize,
}

/// The waiters of a name a [`Ring`] is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// Every waiter (the queue, stream or group is gone: they are answered so).
    Everyone,
    /// RECVs received by this identity.
    Queue(Option<String>),
    /// XREADs after an id.
    Readers,
    /// XREADGROUPs of this group.
    Group(String),
    /// Waits that look at every poll ([`Interest::Any`]).
    Any,
}

impl Ring {
    /// Whether a waiter that looks for `i` is one this rings.
    pub fn matches(&self, i: &Interest) -> bool {
        if i.name() != self.name {
            return false;
        }
        match (&self.who, i) {
            (Who::Everyone, _) | (Who::Readers, Interest::After(..)) | (Who::Any, Interest::Any(_)) => true,
            (Who::Queue(me), Interest::Queue { me: m, .. }) => me == m,
            (Who::Group(g), Interest::Group(_, grp)) => g == grp,
            _ => false,
        }
    }
}

/// Names hinted by notifications and not looked at yet, at most: past it,
/// the next look is a full poll (`hints_overflowed`).
pub const MAX_HINTED: usize = 4096;

/// What a waiting command looks for, received by `me` (`Session::identity`).
pub fn interests(c: &Command, me: Option<String>) -> Vec<Interest> {
    match c {
        Command::Recv(r) => vec![Interest::Queue { name: r.queue.clone(), me }],
        Command::Stream(XCmd::Read { streams, .. }) => streams
            .iter()
            .map(|(k, from)| match from {
                ReadFrom::After(id) => Interest::After(k.clone(), *id),
                ReadFrom::Last => Interest::Any(k.clone()),
            })
            .collect(),
        Command::Stream(XCmd::ReadGroup { group, streams, .. }) => streams
            .iter()
            .map(|(k, read)| match read {
                GroupRead::New => Interest::Group(k.clone(), group.clone()),
                GroupRead::History(_) => Interest::Any(k.clone()),
            })
            .collect(),
        _ => {
            c.wait().map(|(names, _)| names.iter().map(|n| Interest::Any(n.to_string())).collect()).unwrap_or_default()
        }
    }
}

/// One async wait.
struct Watch {
    interests: Vec<Interest>,
    rung: bool,
}

#[derive(Default)]
pub(crate) struct State {
    #[allow(clippy::vec_box)] // jobs move between the queue and here as boxes
    parked: HashMap<String, Vec<Box<Job>>>,
    /// Requests that wait on several names (XREAD of several streams) are
    /// parked under their first: a wake-up of another name wakes it too.
    also: HashMap<String, HashSet<String>>,
    seq: HashMap<String, u64>,
    /// Queues with new messages not yet announced to other processes.
    pub(crate) announce: HashSet<String>,
    /// Maintenance asked for (a queue was dropped).
    pub(crate) tidy: bool,
    /// Poll now (the listener reconnected: notifications may have been missed).
    pub(crate) poll_now: bool,
    /// The async engine's waits, by ticket (the oldest first): what each
    /// looks for, and whether a look rang it.
    watching: BTreeMap<u64, Watch>,
    /// Names another process's notification named since the last look
    /// (at most [`MAX_HINTED`]).
    pub(crate) hinted: HashSet<String>,
    next_ticket: u64,
    pub(crate) stopping: bool,
}

/// RECVs waiting for messages.
pub struct Waiters {
    state: Mutex<State>,
    /// The timer thread waits on it: a request parked, mwmq is stopping.
    pub(crate) changed: Condvar,
    /// The notifier thread waits on it: a queue to announce, maintenance asked for.
    pub(crate) announced: Condvar,
    /// The poller thread waits on it: a hint, a poll asked for, mwmq is stopping.
    pub(crate) look: Condvar,
    /// Other processes on the database hear of new messages (`database.notify`).
    notify: bool,
    /// Rung at every wake-up and at the stop: the async engine's waiting
    /// RECVs look at their queue's wake-up number again.
    pub bell: tokio::sync::Notify,
    /// Statements the shared poll ran (`poller.rs`).
    pub polls: AtomicU64,
    /// Parked requests dropped because their client left.
    pub abandoned: AtomicU64,
    /// Notifications heard on mwmq's channel (hints: `events.rs`).
    pub hints: AtomicU64,
    /// Hints that found [`MAX_HINTED`] names waiting to be looked at (a full poll instead).
    pub hints_overflowed: AtomicU64,
}

/// An async wait registered with [`Waiters::watch`]; unregistered when dropped.
pub struct Watching<'a> {
    waiters: &'a Waiters,
    ticket: u64,
}

impl Watching<'_> {
    /// Whether a look rang this wait ([`Waiters::ring`]).
    pub fn rung(&self) -> bool {
        self.waiters.lock().watching.get(&self.ticket).is_some_and(|w| w.rung)
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.waiters.lock().watching.remove(&self.ticket);
    }
}

impl Waiters {
    /// Nobody waiting; new messages are announced to other processes when `notify`.
    pub fn new(notify: bool) -> Waiters {
        Waiters {
            state: Mutex::default(),
            changed: Condvar::new(),
            announced: Condvar::new(),
            look: Condvar::new(),
            notify,
            bell: Default::default(),
            polls: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            hints: AtomicU64::new(0),
            hints_overflowed: AtomicU64::new(0),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The wake-up number of the queues or streams (the sum of theirs),
    /// read before a RECV or XREAD that may park.
    pub fn seq(&self, names: &[&str]) -> u64 {
        let s = self.lock();
        names.iter().map(|n| s.seq.get(*n).copied().unwrap_or(0)).fold(0, u64::wrapping_add)
    }

    /// Parks `job` unless a wake-up came since `seen`, mwmq is stopping or
    /// its client left: then the job is given back (to be run again at
    /// once, or dropped when its connection is closed).
    pub fn park(&self, names: &[&str], job: Box<Job>, seen: u64) -> Result<(), Box<Job>> {
        let mut s = self.lock();
        let now = names.iter().map(|n| s.seq.get(*n).copied().unwrap_or(0)).fold(0, u64::wrapping_add);
        // (Checked under the lock: `forget` after a close cannot miss the job.)
        if s.stopping || now != seen || names.is_empty() || job.conn.is_closed() {
            return Err(job);
        }
        let first = names[0].to_string();
        for other in &names[1..] {
            s.also.entry(other.to_string()).or_default().insert(first.clone());
        }
        s.parked.entry(first).or_default().push(job);
        drop(s);
        self.changed.notify_all();
        Ok(())
    }

    /// Requests waiting now (parked, and the async engine's).
    pub fn parked(&self) -> usize {
        let s = self.lock();
        s.parked.values().map(Vec::len).sum::<usize>() + s.watching.len()
    }

    /// An async wait for `interests` (registered until the guard is dropped),
    /// so that the shared poll asks for what it waits for.
    pub fn watch(&self, interests: Vec<Interest>) -> Watching<'_> {
        let mut s = self.lock();
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.watching.insert(ticket, Watch { interests, rung: false });
        Watching { waiters: self, ticket }
    }

    /// What the waiting requests look for, each once, with how many look for it.
    pub fn wanted(&self) -> HashMap<Interest, usize> {
        let s = self.lock();
        let mut all: HashMap<Interest, usize> = HashMap::new();
        for i in s.watching.values().flat_map(|w| w.interests.iter()) {
            *all.entry(i.clone()).or_default() += 1;
        }
        for job in s.parked.values().flatten() {
            if let Ok(c) = &job.cmd {
                for i in interests(c, job.conn.identity()) {
                    *all.entry(i).or_default() += 1;
                }
            }
        }
        all
    }

    /// Another process's notification named `name` (or anyone's: any role
    /// that can log in may NOTIFY): the poller looks whether its waiters may
    /// find something, once for a burst of them (`poller.rs`).
    pub fn hint(&self, name: &str) {
        self.hints.fetch_add(1, Ordering::Relaxed);
        let mut s = self.lock();
        if s.hinted.contains(name) {
            return;
        }
        if s.hinted.len() < MAX_HINTED {
            s.hinted.insert(name.to_string());
        } else {
            self.hints_overflowed.fetch_add(1, Ordering::Relaxed);
            s.poll_now = true;
        }
        drop(s);
        self.look.notify_all();
    }

    /// Asks the poller for a full poll now (notifications may have been missed).
    pub fn poll_now(&self) {
        self.lock().poll_now = true;
        self.look.notify_all();
    }

    /// A look found something for `r`'s waiters: up to `r.n` of them, the
    /// oldest first, look again; the others stay parked.
    pub fn ring(&self, queue_of_work: &WorkQueue<Work>, r: &Ring) {
        let mut left = r.n;
        let mut bell = false;
        let jobs = {
            let mut s = self.lock();
            for w in s.watching.values_mut() {
                if left == 0 {
                    break;
                }
                if w.interests.iter().any(|i| r.matches(i)) {
                    // (One rung already and not looking yet counts: it will look.)
                    bell |= !w.rung;
                    w.rung = true;
                    left -= 1;
                }
            }
            let mut firsts = vec![r.name.clone()];
            firsts.extend(s.also.get(&r.name).into_iter().flatten().filter(|f| **f != r.name).cloned());
            let mut taken = Vec::new();
            for first in firsts {
                let Some(jobs) = s.parked.get_mut(&first) else { continue };
                let mut i = 0;
                while i < jobs.len() && left > 0 {
                    let wanted = match &jobs[i].cmd {
                        Ok(c) => interests(c, jobs[i].conn.identity()).iter().any(|x| r.matches(x)),
                        Err(_) => false,
                    };
                    if wanted {
                        taken.push(jobs.remove(i));
                        left -= 1;
                    } else {
                        i += 1;
                    }
                }
            }
            s.parked.retain(|_, v| !v.is_empty());
            taken
        };
        if bell {
            self.bell.notify_waiters();
        }
        for job in jobs {
            requeue(queue_of_work, job);
        }
    }

    /// The parked requests of connection `conn_id` (its client left), taken
    /// out: the caller frees what they hold.
    #[allow(clippy::vec_box)] // jobs move between the queue and here as boxes
    pub fn forget(&self, conn_id: u64) -> Vec<Box<Job>> {
        let mut gone = Vec::new();
        let mut s = self.lock();
        for jobs in s.parked.values_mut() {
            if jobs.iter().any(|j| j.conn.id == conn_id) {
                let (theirs, others) = std::mem::take(jobs).into_iter().partition(|j| j.conn.id == conn_id);
                *jobs = others;
                gone.extend::<Vec<Box<Job>>>(theirs);
            }
        }
        if !gone.is_empty() {
            s.parked.retain(|_, v| !v.is_empty());
            if s.parked.is_empty() {
                s.also.clear();
            }
            self.abandoned.fetch_add(gone.len() as u64, Ordering::Relaxed);
        }
        gone
    }

    /// A message may be there for `queue`'s waiters: they run again.
    pub fn wake(&self, queue_of_work: &WorkQueue<Work>, queue: &str) {
        let jobs = {
            let mut s = self.lock();
            *s.seq.entry(queue.to_string()).or_insert(0) += 1;
            let mut jobs = s.parked.remove(queue).unwrap_or_default();
            for first in s.also.remove(queue).unwrap_or_default() {
                jobs.extend(s.parked.remove(&first).unwrap_or_default());
            }
            jobs
        };
        self.bell.notify_waiters();
        for job in jobs {
            requeue(queue_of_work, job);
        }
    }

    /// A SEND to `queue` committed here: wake local waiters and announce it.
    pub fn sent(&self, queue_of_work: &WorkQueue<Work>, queue: &str) {
        if self.notify {
            let fresh = self.lock().announce.insert(queue.to_string());
            if fresh {
                self.announced.notify_one();
            }
        }
        self.wake(queue_of_work, queue);
    }

    /// A queue was dropped: its messages are removed soon.
    pub fn dropped(&self, queue_of_work: &WorkQueue<Work>, queue: &str) {
        self.lock().tidy = true;
        self.announced.notify_one();
        self.wake(queue_of_work, queue);
    }

    /// Stopping: every parked request is answered now; none parks again.
    pub fn stop(&self, queue_of_work: &WorkQueue<Work>) {
        let all: Vec<Box<Job>> = {
            let mut s = self.lock();
            s.stopping = true;
            s.parked.drain().flat_map(|(_, v)| v).collect()
        };
        self.changed.notify_all();
        self.look.notify_all();
        self.announced.notify_all();
        self.bell.notify_waiters();
        for mut job in all {
            job.last_try = true;
            requeue(queue_of_work, job);
        }
    }

    /// Answers the parked requests whose wait is over, and takes out those
    /// whose client left (returned: the caller frees what they hold); when
    /// the next wait ends.
    #[allow(clippy::vec_box)] // jobs move between the queue and here as boxes
    pub(crate) fn due(&self, queue_of_work: &WorkQueue<Work>, now: Instant) -> (Option<Instant>, Vec<Box<Job>>) {
        let mut due = Vec::new();
        let mut gone = Vec::new();
        let mut next: Option<Instant> = None;
        {
            let mut s = self.lock();
            for jobs in s.parked.values_mut() {
                let mut keep = Vec::with_capacity(jobs.len());
                for mut job in jobs.drain(..) {
                    let until = job.wait_until.unwrap_or(now);
                    if job.conn.is_closed() {
                        gone.push(job);
                    } else if until <= now {
                        job.last_try = true;
                        due.push(job);
                    } else {
                        next = Some(next.map_or(until, |n| n.min(until)));
                        keep.push(job);
                    }
                }
                *jobs = keep;
            }
            s.parked.retain(|_, v| !v.is_empty());
            if s.parked.is_empty() {
                s.also.clear();
            }
        }
        self.abandoned.fetch_add(gone.len() as u64, Ordering::Relaxed);
        for job in due {
            requeue(queue_of_work, job);
        }
        (next, gone)
    }
}

fn requeue(queue_of_work: &WorkQueue<Work>, mut job: Box<Job>) {
    let now = mwstats::clock::now_ns();
    if let Some(at) = job.parked_at.take() {
        job.parked_ns += now.saturating_sub(at);
    }
    job.t_enqueue = now;
    queue_of_work.push_again(Work::Request(job));
}
