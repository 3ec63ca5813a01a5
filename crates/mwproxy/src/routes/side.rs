//! The side queue: copies of requests that nobody waits for — shadow copies,
//! all-async and all-initial children, warm-up fills — and the thread that
//! carries them.
//!
//! A copy is handed over at once and the client's request goes on; the
//! node that made it holds a bounded number of copies waiting or on their
//! way (its `queue`, `run.rs`) and a copy beyond that is dropped and
//! counted, so a shadow pool that never answers holds no more memory than
//! its bound, and its replies and failures reach no client. The side thread
//! is a carrier like a pool worker: its own connection to each server it
//! uses, the same exchange rules (a server marked down fails its copies at
//! once), rounds of up to [`BATCH`] copies at a time.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};

use mwstats::clock::now_ns;

use crate::backend::Backend;
use crate::exchange::{Ended, Exchange, Servers};
use crate::route::{Outbox, Work};
use crate::worker::{read_replies, write_all, Tag};

use super::flow::Flow;
use super::spec::NodeId;
use super::tree::Tree;

/// Copies carried in one go.
pub const BATCH: usize = 64;
/// How long copies gather after a round that was not full.
pub const GATHER: std::time::Duration = std::time::Duration::from_millis(1);

/// A copy of a request for `node` of `tree`, made by `owner`.
#[derive(Debug)]
pub struct Detached {
    /// The tree it was routed with.
    pub tree: Arc<Tree>,
    /// The node whose bound it counts against.
    pub owner: NodeId,
    /// Where it goes.
    pub node: NodeId,
    /// The request.
    pub work: Work,
}

/// Copies waiting for the side thread.
#[derive(Default)]
pub struct Queue {
    items: Mutex<Waiting>,
    ready: Condvar,
}

#[derive(Default)]
struct Waiting {
    copies: VecDeque<Detached>,
    closed: bool,
    /// The side thread waits for copies (only then is it woken: a wake-up
    /// is a system call, and copies need no haste).
    idle: bool,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Queue({} waiting)", self.lock().copies.len())
    }
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands `copy` over; false once the queue is closed.
    pub fn push(&self, copy: Detached) -> bool {
        let mut q = self.lock();
        if q.closed {
            return false;
        }
        q.copies.push_back(copy);
        if std::mem::take(&mut q.idle) {
            self.ready.notify_one();
        }
        true
    }

    /// Waits for copies and moves up to `most` of them into `out`; false
    /// once the queue is closed and empty.
    pub fn pop(&self, most: usize, out: &mut Vec<Detached>) -> bool {
        let mut q = self.lock();
        while q.copies.is_empty() && !q.closed {
            q.idle = true;
            q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        q.idle = false;
        let n = q.copies.len().min(most);
        out.extend(q.copies.drain(..n));
        n > 0
    }

    /// No more copies: the side thread ends once it has carried the ones it holds.
    pub fn close(&self) {
        let mut q = self.lock();
        q.closed = true;
        q.copies.clear();
        self.ready.notify_all();
    }
}

/// A copy on its way.
struct Job {
    flow: Flow,
    tree: Arc<Tree>,
    owner: NodeId,
    done: bool,
}

/// A connection to one server and its exchange.
struct Link {
    conn: Backend,
    ex: Exchange<Tag>,
}

/// The side thread: carries copies until the queue is closed.
pub fn serve(queue: &Queue, servers: &Servers) {
    let mut links: Vec<Link> = Vec::new();
    let mut outbox = Outbox::new(0);
    let mut owners: Vec<Tag> = Vec::new();
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut rr = 0;
    while queue.pop(BATCH, &mut batch) {
        let full = batch.len() == BATCH;
        let mut jobs: Vec<Job> = batch
            .drain(..)
            .map(|d| Job {
                flow: Flow::begin(&d.tree, d.node, d.work, &mut rr),
                tree: d.tree,
                owner: d.owner,
                done: false,
            })
            .collect();
        loop {
            outbox.clear();
            owners.clear();
            for (i, job) in jobs.iter_mut().enumerate().filter(|(_, j)| !j.done) {
                let n = job.flow.round(&job.tree, &mut outbox);
                job.done = n == 0;
                owners.extend((0..n).map(|j| (i, j)));
            }
            if owners.is_empty() {
                break;
            }
            exchange(servers, &mut links, &outbox, &owners, &mut out, &mut jobs);
        }
        for mut job in jobs {
            let (_, fx) = job.flow.finish();
            for (pos, key) in fx.repairs {
                servers.repairs.note(job.tree.ids[pos], key);
            }
            job.tree.stats[job.owner].queued.fetch_sub(1, Ordering::Relaxed);
        }
        if !full {
            // Let copies gather: one round trip carries many.
            std::thread::sleep(GATHER);
        }
    }
}

/// Writes a round to every server involved, then reads every reply (as a
/// pool worker does).
fn exchange(
    servers: &Servers,
    links: &mut Vec<Link>,
    outbox: &Outbox,
    owners: &[Tag],
    out: &mut Vec<u8>,
    jobs: &mut [Job],
) {
    while links.len() < outbox.servers() {
        let s = links.len();
        links.push(Link { conn: Backend::new(servers.addr(s)), ex: Exchange::new(s) });
    }
    let connect_timeout = servers.connect_timeout();
    let mut ended = |end: Ended<'_, Tag>| {
        let (i, j) = end.tag;
        let job = &mut jobs[i];
        // (This carrier reads every reply of a round: calls an all-fastest
        // no longer needs are read and ignored.)
        job.flow.absorb(&job.tree, j, end.outcome, &mut Vec::new());
    };
    for (s, Link { conn, ex }) in links.iter_mut().enumerate() {
        if outbox.bytes(s).is_empty() {
            continue;
        }
        out.clear();
        let open = || conn.open(connect_timeout, || servers.tls(s));
        if ex.begin(servers, outbox, owners, out, now_ns(), open, &mut ended) {
            if let Err(e) = write_all(conn, ex, servers, out, &mut ended) {
                conn.close();
                ex.fail(servers, &e, now_ns(), &mut ended);
            }
        }
    }
    for Link { conn, ex } in links.iter_mut().filter(|l| l.ex.in_flight()) {
        if let Err(e) = read_replies(conn, ex, servers, &mut ended) {
            conn.close();
            ex.fail(servers, &e, now_ns(), &mut ended);
        } else if ex.in_flight() {
            conn.close();
            ex.fail(servers, &crate::route::BackendError::Stalled, now_ns(), &mut ended);
        }
    }
}
