//! Streams under queues' rules (schema version 12): what a stream holds is
//! counted, bounded and read back in bounded pieces, as a queue's is.
//!
//! - **Who made it.** A stream remembers the user whose XADD (or XGROUP
//!   CREATE ... MKSTREAM, or XGROUP DEADLETTER's target) created it, and
//!   counts against that user's `max_queues` together with its queues
//!   (`mwmq_owned`, which QCREATE uses too). The count is taken under a
//!   per-user advisory lock, so concurrent creations by one user cannot
//!   pass the limit together.
//! - **What it holds.** Each entry records its bytes (fields and values)
//!   and how many fields and values it has; each stream the bytes of its
//!   entries, kept by XADD, XTRIM, XDEL and trimming as `length` is.
//!   QALTER's MAXMESSAGES and MAXBYTES on a stream bound entries and bytes:
//!   an XADD past them is refused (`-OVERQUOTA stream ... is full`), checked
//!   under the stream's row lock, so exactly.
//! - **Replies in pieces.** Every function that returns entries stops once
//!   the entries it returned weigh `maxb` (the server's `max_reply_bytes`):
//!   an entry weighs its bytes, 16 per field or value and 64 for its id and
//!   framing ([`entry_weight`], RESP's framing rounded up). The first entry
//!   of a reply is always returned, so a reply is at most `maxb` or one
//!   entry. The cut falls between entries, as COUNT's does: XREADGROUP
//!   delivers, XCLAIM claims and XAUTOCLAIM's cursor stops where it fell.
//!   The rows never exist beyond that in mwmq: tokio-postgres buffers a
//!   statement's whole result, so the bound is the database's to keep.
//!   (Schema 15, `streambounds.rs`, refuses a range over the bound instead
//!   of cutting it, has the reads say when they cut, and counts 16 bytes per
//!   field or value toward MAXBYTES.)

use crate::xcommand::AddId;

/// Bytes an entry's reply is counted with beyond its fields and values: for
/// each field or value (its `$len\r\n` and `\r\n`).
pub const PER_ITEM: usize = 16;
/// ... and for the entry itself (its id and the arrays around it).
pub const PER_ENTRY: usize = 64;

/// What an entry of `fields` counts for in a reply's bytes, as the database
/// functions count it (`bytes + 16 * items + 64`).
pub fn entry_weight(fields: &[Vec<u8>]) -> usize {
    fields.iter().map(|f| f.len() + PER_ITEM).sum::<usize>() + PER_ENTRY
}

/// An XADD's size as `max_body` bounds it: its fields' and values' bytes
/// and its id's, as given (`*`, `ms-*`, `ms-seq`).
pub fn xadd_size(id: &AddId, fields: &[Vec<u8>]) -> usize {
    let id_len = match id {
        AddId::Auto => 1,
        AddId::AtMs(ms) => ms.to_string().len() + 2,
        AddId::Exact(id) => id.text().len(),
    };
    fields.iter().map(Vec::len).sum::<usize>() + id_len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xcommand::Sid;

    #[test]
    fn sizes_count_fields_values_and_the_id() {
        let f = vec![b"field".to_vec(), b"value!".to_vec()];
        assert_eq!(xadd_size(&AddId::Auto, &f), 11 + 1);
        assert_eq!(xadd_size(&AddId::AtMs(1234), &f), 11 + 6);
        assert_eq!(xadd_size(&AddId::Exact(Sid { ms: 12, seq: 3 }), &f), 11 + 4);
        assert_eq!(entry_weight(&f), 11 + 2 * 16 + 64);
    }
}
