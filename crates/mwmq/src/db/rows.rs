//! What the statements return, and what they are given.

/// One SEND (alone, or in a batch).
#[derive(Debug, Clone, Copy)]
pub struct SendRow<'a> {
    /// Queue.
    pub queue: &'a str,
    /// Sender's name.
    pub sender: &'a str,
    /// Receiver, if addressed.
    pub to: Option<&'a str>,
    /// The message.
    pub body: &'a [u8],
    /// Invisible for this long.
    pub delay_ms: u64,
    /// Its ordered group, if any.
    pub group: Option<&'a str>,
    /// Higher is handed out first (0 to 9).
    pub priority: u8,
}

/// A leased message as RECV returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    /// The database it lives on (for releasing the lease).
    pub db: usize,
    /// The queue's internal id (for releasing the lease).
    pub queue_id: i64,
    /// Message id.
    pub id: i64,
    /// Lease number; ACK and NACK need it.
    pub lease: i64,
    /// Who sent it.
    pub sender: String,
    /// The message.
    pub body: Vec<u8>,
    /// Its priority (replies list the highest first).
    pub priority: i16,
}

/// What a RECV got.
#[derive(Debug, Default)]
pub struct Received {
    /// The messages it leased.
    pub messages: Vec<Leased>,
    /// Messages it found delivered too often and moved to the dead-letter queue.
    pub dead_lettered: u64,
    /// ... or dropped, there being no dead-letter queue.
    pub dropped: u64,
    /// Whether the queue proved not plain (the full statement leased what the plain one could not).
    pub not_plain: bool,
    /// Statements it ran (the plain one, the full one, or both).
    pub statements: u64,
    /// Whether the queue proved to have held messages of other priorities
    /// than 0 (its RECVs then walk them: the `*_ranked` statements).
    pub prioritized: bool,
}

/// What QINFO reports of the database.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueState {
    /// Deliveries before dead-lettering (0: never).
    pub max_deliveries: u32,
    /// Where dead letters go.
    pub dead_letter: Option<String>,
    /// Visible now.
    pub ready: i64,
    /// Sent with a DELAY or NACKed with one, not visible yet.
    pub delayed: i64,
    /// Leased by a RECV.
    pub leased: i64,
    /// Messages here that were dead-lettered from another queue.
    pub dead_letters_held: i64,
    /// Age of the visible message next in line, ms (0 without one).
    pub oldest_ready_ms: i64,
    /// Most messages it may hold (0: no limit).
    pub max_messages: i64,
    /// Most bytes of bodies it may hold (0: no limit).
    pub max_bytes: i64,
    /// Messages it holds, as its quota counts them (0 without a quota).
    pub counted_messages: i64,
    /// Bytes of bodies it holds, as its quota counts them (0 without a quota).
    pub counted_bytes: i64,
    /// Whether it hands out nothing (QPAUSE).
    pub paused: bool,
    /// Most messages leased at once (0: no limit).
    pub concurrency: i64,
    /// Most deliveries per second (0: no limit).
    pub rate: f64,
    /// RECVs the concurrency limit cut short, across every mwmq process.
    pub held_by_concurrency: i64,
    /// RECVs the rate limit cut short, across every mwmq process.
    pub held_by_rate: i64,
    /// How long acknowledged messages are kept, ms (0: not kept).
    pub retain_ms: i64,
    /// Acknowledged messages kept now.
    pub archived: i64,
    /// The ready messages of each priority that has some, highest first: (priority, count).
    pub ready_by_priority: Vec<(i32, i64)>,
    /// The retry backoff (`None`: none).
    pub backoff: Option<crate::policies::Backoff>,
}

/// A dead letter (QDEAD).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Message id.
    pub id: i64,
    /// The queue it is in now (a dead-letter queue).
    pub queue: String,
    /// The queue it was dead-lettered from.
    pub from: String,
    /// Why (`max_deliveries`).
    pub reason: Option<String>,
    /// Times it was handed out.
    pub deliveries: i64,
    /// Who sent it.
    pub sender: String,
    /// When it was sent, ms since 1970.
    pub sent_at_ms: i64,
    /// Its body.
    pub body: Vec<u8>,
}

/// An acknowledged message kept by a retaining queue (QARCHIVE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archived {
    /// Message id.
    pub id: i64,
    /// Who sent it.
    pub sender: String,
    /// Its body.
    pub body: Vec<u8>,
    /// Times it was handed out.
    pub deliveries: i64,
    /// When it was acknowledged, ms since 1970.
    pub acked_at_ms: i64,
    /// The receiver it was delivered to (none: delivered to no named receiver).
    pub acked_by: Option<String>,
}

/// A message as POP and PEEK return it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Message id.
    pub id: i64,
    /// Who sent it.
    pub sender: String,
    /// The message.
    pub body: Vec<u8>,
    /// Its priority (replies list the highest first).
    pub priority: i16,
}

/// A lease to give back (its reply never reached the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRef {
    /// The database (index in the `[[databases]]` list).
    pub db: usize,
    /// Queue id.
    pub queue_id: i64,
    /// Message id.
    pub id: i64,
    /// Lease number.
    pub lease: i64,
}
