//! Streams under queues' rules, round two (schema version 13): replies that
//! say when the bound on their bytes cut them, stream bytes that count what
//! each field costs, and the SQL API's "queue is full" with its figures.
//!
//! - **A range is whole or refused.** XRANGE and XREVRANGE (and XINFO
//!   STREAM FULL's entries) used to stop quietly at `max_reply_bytes`, and
//!   a client paging with COUNT takes a short page for the end of the
//!   stream. Now `mwmq_xrange` raises [`REPLY_TOO_LARGE`] instead (the rows
//!   already produced are dropped by the database, never sent), and the
//!   client asks for fewer entries with COUNT; a reply of one entry is never
//!   refused. The consumption commands (XREAD, XREADGROUP, XCLAIM,
//!   XAUTOCLAIM) still cut — fewer entries than COUNT is normal for them and
//!   nothing is lost (what was not returned was not delivered or claimed) —
//!   and now say so with one extra row, only when they cut: XREAD's and
//!   XREADGROUP's rows of index -1 (XREADGROUP of several consumers at once:
//!   one per consumer cut), XCLAIM's row without an id, XAUTOCLAIM's row of
//!   kind 3. [`ReplyCounts`] counts both, for INFO and `/metrics`.
//! - **What MAXBYTES counts.** A stream's `bytes` (what QALTER's MAXBYTES
//!   bounds and XINFO STREAM shows) is now each entry's fields' and values'
//!   bytes plus 16 for each field or value (`PER_ITEM`, as a reply weighs
//!   them), so a thousand empty fields are not free. Entries keep their own
//!   bytes without it (replies weigh them as before).
//! - **mwmq.send's full queue.** Its refusal at the send now carries the
//!   figures RESP's refusal and the check at COMMIT give; the one statement
//!   is replaced in whatever body of `mwmq.send` the earlier versions left
//!   (`sqlguard.rs` wrote it), so this version does not undo theirs.

use std::sync::atomic::{AtomicU64, Ordering};

/// The most entries one reply carries (XRANGE, XREAD, XREADGROUP without
/// COUNT or with a larger one; XPENDING, XINFO STREAM FULL): a reply is
/// built whole, so this bounds its rows; `max_reply_bytes` bounds its bytes.
/// Redis has no such bound; clients page with COUNT. A range that would
/// carry more is refused (`commands/streams.rs`), a read stops there.
pub const MAX_REPLY_ENTRIES: i64 = 10_000;

/// The start of the refusal of an XRANGE, XREVRANGE or XINFO STREAM FULL
/// whose entries would weigh more than `max_reply_bytes`.
pub const REPLY_TOO_LARGE: &str = "ERR the reply would exceed max_reply_bytes";

/// Stream replies the bound on their bytes or entries shaped, since start.
#[derive(Debug, Default)]
pub struct ReplyCounts {
    /// XRANGE, XREVRANGE and XINFO STREAM FULL refused (over
    /// `max_reply_bytes`, or over the entries a reply carries).
    pub refused: AtomicU64,
    /// XREAD, XREADGROUP, XCLAIM and XAUTOCLAIM replies cut by
    /// `max_reply_bytes` (fewer entries than they could have had).
    pub cut: AtomicU64,
}

impl ReplyCounts {
    /// A reply refused.
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` replies cut.
    pub fn cut(&self, n: u64) {
        if n > 0 {
            self.cut.fetch_add(n, Ordering::Relaxed);
        }
    }
}
