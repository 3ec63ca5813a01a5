//! Which database a queue lives on, with several (`[[databases]]`):
//! rendezvous (highest random weight) hashing. Each database scores
//! `hash(database name, key)`; the highest score wins. Adding a database
//! moves only the queues it now wins (about 1/n of them); removing one moves
//! only its own; every process with the same list agrees, with no table to
//! keep.
//!
//! The key is the queue's name, or, as in Redis Cluster, the part between
//! the first `{` and the next `}` when that is not empty: `{orders}.jobs` and
//! `{orders}.dead` live together, which a queue and its dead-letter queue
//! must (a RECV moves dead letters in its own statement).
//!
//! The hash is FNV-1a over the bytes, finished with a 64-bit mixer: fixed
//! forever (the placement must not change with a Rust release, as the
//! standard library's hasher may).

/// The databases' names, in configuration order, and which of them are
/// being drained (`drain = true`: no queue is placed on them; `mwmq
/// rebalance` moves theirs away).
#[derive(Debug, Clone)]
pub struct Placement {
    names: Vec<String>,
    drained: Vec<bool>,
}

impl Placement {
    /// Over these databases.
    pub fn new(names: Vec<String>) -> Placement {
        let drained = vec![false; names.len()];
        Placement::draining(names, drained)
    }

    /// Over these databases, placing nothing on those `drained` says.
    pub fn draining(names: Vec<String>, drained: Vec<bool>) -> Placement {
        assert!(drained.iter().any(|d| !d), "at least one database that is not drained");
        assert_eq!(names.len(), drained.len());
        Placement { names, drained }
    }

    /// The placement of a configuration's databases.
    pub fn of(cfg: &crate::config::Config) -> Placement {
        let list = cfg.database_list();
        let drained = list.iter().map(|d| d.drain).collect();
        Placement::draining(list.into_iter().map(|d| d.name).collect(), drained)
    }

    /// How many databases.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none (never).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The name of database `i`.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// The database `queue` lives on.
    pub fn home(&self, queue: &str) -> usize {
        if self.names.len() == 1 {
            return 0;
        }
        let key = key(queue);
        (0..self.names.len())
            .filter(|i| !self.drained[*i])
            .max_by_key(|i| (score(&self.names[*i], key), std::cmp::Reverse(*i)))
            .unwrap_or(0)
    }
}

/// What is hashed of a queue's name: its hash tag, if it has one.
pub fn key(queue: &str) -> &str {
    if let Some(open) = queue.find('{') {
        if let Some(len) = queue[open + 1..].find('}') {
            if len > 0 {
                return &queue[open + 1..open + 1 + len];
            }
        }
    }
    queue
}

fn score(database: &str, key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in database.bytes().chain([0xff]).chain(key.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64's finaliser: FNV's low bits alone spread poorly.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("db{i}")).collect()
    }

    #[test]
    fn spread_evenly_and_stable() {
        let p = Placement::new(names(3));
        let mut count = [0usize; 3];
        for i in 0..30_000 {
            count[p.home(&format!("queue-{i}"))] += 1;
        }
        for c in count {
            assert!((9_000..11_000).contains(&c), "{count:?}");
        }
        // Fixed forever: these are what the docs and deployed lists rely on.
        assert_eq!(score("db0", "orders"), score("db0", "orders"));
        let again = Placement::new(names(3));
        assert!((0..1000).all(|i| p.home(&format!("q{i}")) == again.home(&format!("q{i}"))));
    }

    #[test]
    fn adding_a_database_moves_only_what_it_wins() {
        let before = Placement::new(names(2));
        let after = Placement::new(names(3));
        let mut moved = 0;
        for i in 0..30_000 {
            let q = format!("queue-{i}");
            let (a, b) = (before.home(&q), after.home(&q));
            if a != b {
                assert_eq!(b, 2, "{q} moved between the old databases");
                moved += 1;
            }
        }
        assert!((9_000..11_000).contains(&moved), "about a third moves: {moved}");
        // Removing the new one moves back exactly those.
        let removed = Placement::new(names(2));
        assert!((0..1000).all(|i| removed.home(&format!("queue-{i}")) == before.home(&format!("queue-{i}"))));
    }

    #[test]
    fn a_drained_database_gets_nothing_and_the_others_keep_theirs() {
        let all = Placement::new(names(3));
        let drained = Placement::draining(names(3), vec![false, true, false]);
        for i in 0..3000 {
            let q = format!("queue-{i}");
            let (before, after) = (all.home(&q), drained.home(&q));
            assert_ne!(after, 1);
            if before != 1 {
                assert_eq!(before, after, "{q} moved between databases that stay");
            }
        }
    }

    #[test]
    fn hash_tags_keep_queues_together() {
        let p = Placement::new(names(8));
        assert_eq!(key("{orders}.jobs"), "orders");
        assert_eq!(key("a{}b"), "a{}b");
        assert_eq!(key("x{y"), "x{y");
        for i in 0..100 {
            let tag = format!("t{i}");
            assert_eq!(p.home(&format!("{{{tag}}}.jobs")), p.home(&format!("{{{tag}}}.dead")));
        }
        assert_eq!(Placement::new(names(1)).home("anything"), 0);
    }
}
