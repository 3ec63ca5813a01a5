//! What both command parsers (`command.rs` for queues, `xcommand.rs` for
//! streams) share about the client's words: how long a name may be, and how
//! much of a client's bytes an error quotes.

/// Longest queue or client name, in bytes.
pub const MAX_NAME: usize = 200;

/// Longest visibility timeout or delay (7 days), in ms (SEND's and
/// QSCHEDULE's DELAY, RECV's VT, NACK's DELAY).
pub const MAX_DELAY_MS: u64 = 7 * 24 * 3600 * 1000;

/// What an error quotes of the client's bytes: the first 64, escaped (a
/// reply that reserves nothing of the output budget stays small: `output.rs`).
pub fn shown(arg: &[u8]) -> String {
    arg.iter().take(64).flat_map(|b| std::ascii::escape_default(*b)).map(char::from).collect()
}
