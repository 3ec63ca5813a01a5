//! The side thread: it carries the copies of requests that nobody waits
//! for — shadow copies, all-async and all-initial children, warm-up fills —
//! taken from the side queue (`queue.rs`).
//!
//! A copy is handed over at once and the client's request goes on; the
//! node that made it holds a bounded number of copies waiting or on their
//! way (its `queue`, `run.rs`) and a copy beyond that is dropped and
//! counted, so a shadow pool that never answers holds no more memory than
//! its bound, and its replies and failures reach no client. The side thread
//! is a carrier like a pool worker: its own connection to each server it
//! uses, the same exchange rules (a server marked down fails its copies at
//! once), rounds of up to [`BATCH`] copies at a time.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::carry::{Link, Tag};
use crate::exchange::{Ended, Servers};
use crate::route::Outbox;

use super::flow::Flow;
use super::queue::Queue;
use super::spec::NodeId;
use super::tree::{Detached, Tree};

/// Copies carried in one go.
pub const BATCH: usize = 64;
/// How long copies gather after a round that was not full.
pub const GATHER: std::time::Duration = std::time::Duration::from_millis(1);

/// A copy on its way.
struct Job {
    flow: Flow,
    tree: Arc<Tree>,
    owner: NodeId,
    bytes: u64,
    done: bool,
}

/// The side thread: carries copies until the queue is closed.
pub fn serve(queue: &Queue<Detached>, servers: &Servers) {
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
                bytes: d.bytes,
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
            let mut ended = |end: Ended<'_, Tag>| {
                let (i, j) = end.tag;
                let job = &mut jobs[i];
                // (This carrier reads every reply of a round: calls an
                // all-fastest no longer needs are read and ignored.)
                job.flow.absorb(&job.tree, j, end.outcome, &mut Vec::new());
            };
            crate::carry::exchange(servers, &mut links, &outbox, &owners, &mut out, &mut ended);
        }
        for mut job in jobs {
            let (_, fx) = job.flow.finish();
            for (pos, key) in fx.repairs {
                servers.repairs.note(job.tree.ids[pos], key);
            }
            let stats = &job.tree.stats[job.owner];
            stats.queued.fetch_sub(1, Ordering::Relaxed);
            stats.queued_bytes.fetch_sub(job.bytes, Ordering::Relaxed);
            job.tree.side.release(job.bytes);
        }
        if !full {
            // Let copies gather: one round trip carries many.
            std::thread::sleep(GATHER);
        }
    }
}
