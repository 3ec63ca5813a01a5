//! Why a server gave no usable reply: what the routing core, the health
//! of the servers and the checker all speak of (kept apart from both, so
//! that neither imports the other for it).

/// Why a server gave no usable reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The server is marked down (or another request is probing it).
    #[error("unavailable")]
    Down,
    /// The server stopped answering: requests are not sent to it, and waiting
    /// ones are given up, while one probe waits for it.
    #[error("stalled")]
    Stalled,
    /// Connecting failed.
    #[error("connect failed: {0}")]
    Connect(String),
    /// Reading or writing failed, or the server closed the connection.
    #[error("connection lost: {0}")]
    Io(String),
    /// No complete reply before the deadline.
    #[error("timeout")]
    Timeout,
    /// The server sent something that is not a memcached reply.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The reply grew beyond what the request can legitimately produce.
    #[error("reply too large")]
    TooLarge,
}
