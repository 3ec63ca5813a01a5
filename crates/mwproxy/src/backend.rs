//! Connections from a worker to the memcached servers, and the servers' shared health.
//!
//! Every worker owns one blocking connection per server, so a job's requests
//! are written to all servers involved before any reply is read. A connection
//! that fails (refused, reset, timed out, or answered with bytes that are not
//! memcached replies) is dropped, because a late reply would be taken for the
//! answer to the next request. The server is then marked down in [`Health`],
//! shared by all workers, so that the others answer at once instead of each
//! waiting for its own timeout; after a backoff that doubles up to a maximum one
//! worker tries again, and a success brings the server back for everybody.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mcproto::{MalformedResponse, ReadBuf};

use crate::config::BackendConfig;

/// How a reply is delimited: [`mcproto::response_len`] for one response,
/// [`mcproto::meta_reply_len`] for a meta command sent with an `mn` after it.
pub type Framing = fn(&[u8]) -> Result<Option<usize>, MalformedResponse>;

/// Why a server did not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The server is marked down and waits for its next reconnection attempt.
    #[error("unavailable")]
    Down,
    /// Connecting failed.
    #[error("connect failed: {0}")]
    Connect(String),
    /// Reading or writing failed, or the server closed the connection.
    #[error("connection lost: {0}")]
    Io(String),
    /// No complete reply within the timeout.
    #[error("timeout")]
    Timeout,
    /// The server sent something that is not a memcached reply.
    #[error("protocol error: {0}")]
    Protocol(String),
}

/// Liveness of one server as seen by all workers.
#[derive(Debug, Default)]
pub struct Health {
    /// Milliseconds since the proxy's start before which nobody should try.
    down_until_ms: AtomicU64,
    /// Consecutive failures; decides the backoff.
    failures: AtomicU32,
}

impl Health {
    /// Whether requests should be sent now.
    pub fn is_up(&self, now_ms: u64) -> bool {
        self.down_until_ms.load(Ordering::Relaxed) <= now_ms
    }

    /// Whether the server currently counts as failed.
    pub fn failing(&self) -> bool {
        self.failures.load(Ordering::Relaxed) > 0
    }

    fn record_failure(&self, now_ms: u64, cfg: &BackendConfig) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed).min(16);
        let backoff = (cfg.retry_min_ms << n).min(cfg.retry_max_ms);
        self.down_until_ms.store(now_ms + backoff, Ordering::Relaxed);
    }

    fn record_success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
            self.down_until_ms.store(0, Ordering::Relaxed);
        }
    }
}

/// A worker's connection to one server.
pub struct Backend {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    /// Bytes read but not yet consumed.
    buf: ReadBuf,
    /// The connection has carried at least one complete exchange.
    used: bool,
    /// Reconnections made after a failure, not yet counted in the stats.
    reconnects: u64,
}

const READ_CHUNK: usize = 64 * 1024;

impl Backend {
    /// A connection to be opened on first use.
    pub fn new(addr: SocketAddr) -> Backend {
        Backend { addr, stream: None, buf: ReadBuf::with_capacity(READ_CHUNK), used: false, reconnects: 0 }
    }

    /// Reconnections since the last call (for the stats).
    pub fn take_reconnects(&mut self) -> u64 {
        std::mem::take(&mut self.reconnects)
    }

    /// Opens the connection if needed. Fails fast while the server is marked down.
    fn ensure(&mut self, health: &Health, now_ms: u64, cfg: &BackendConfig) -> Result<(), BackendError> {
        if self.stream.is_some() {
            return Ok(());
        }
        if !health.is_up(now_ms) {
            return Err(BackendError::Down);
        }
        let timeout = Duration::from_millis(cfg.connect_timeout_ms);
        match TcpStream::connect_timeout(&self.addr, timeout) {
            Ok(s) => {
                let io_timeout = Some(Duration::from_millis(cfg.timeout_ms));
                let _ = s.set_nodelay(true);
                let _ = s.set_read_timeout(io_timeout);
                let _ = s.set_write_timeout(io_timeout);
                if health.failing() {
                    self.reconnects += 1;
                }
                self.stream = Some(s);
                self.buf.clear();
                self.used = false;
                Ok(())
            }
            Err(e) => {
                health.record_failure(now_ms, cfg);
                Err(BackendError::Connect(e.to_string()))
            }
        }
    }

    /// Writes a whole request, connecting first if needed (fails fast while the
    /// server is marked down).
    pub fn send(
        &mut self,
        health: &Health,
        now_ms: u64,
        cfg: &BackendConfig,
        bytes: &[u8],
    ) -> Result<(), BackendError> {
        self.ensure(health, now_ms, cfg)?;
        let stream = self.stream.as_mut().ok_or(BackendError::Down)?;
        stream.write_all(bytes).map_err(io_error)
    }

    /// Whether the connection had carried complete exchanges before, so that a
    /// close right after sending means the server went away while it was idle.
    pub fn was_used(&self) -> bool {
        self.used
    }

    /// Reads until one whole reply, as `framing` delimits it, is buffered and
    /// returns its length; the reply stays buffered until [`Backend::consume`].
    pub fn recv(&mut self, deadline: Instant, framing: Framing) -> Result<usize, BackendError> {
        loop {
            match framing(self.buf.filled()) {
                Ok(Some(n)) => return Ok(n),
                Ok(None) => {}
                Err(e) => return Err(BackendError::Protocol(e.to_string())),
            }
            if Instant::now() >= deadline {
                return Err(BackendError::Timeout);
            }
            let stream = self.stream.as_mut().ok_or(BackendError::Down)?;
            let r = stream.read(self.buf.spare(READ_CHUNK / 4));
            match r {
                Ok(0) => return Err(BackendError::Io("closed by server".into())),
                Ok(n) => self.buf.commit(n),
                Err(e) => {
                    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                        return Err(BackendError::Timeout);
                    }
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(io_error(e));
                    }
                }
            }
        }
    }

    /// The buffered reply of `len` bytes (as returned by [`Backend::recv`]).
    pub fn reply(&self, len: usize) -> &[u8] {
        &self.buf.filled()[..len]
    }

    /// Drops a reply that has been used.
    pub fn consume(&mut self, len: usize) {
        self.buf.consume(len);
        self.buf.shrink_to(READ_CHUNK);
        self.used = true;
    }

    /// Closes the connection after an error and marks the server down.
    pub fn fail(&mut self, health: &Health, now_ms: u64, cfg: &BackendConfig, err: &BackendError) {
        if let Some(s) = self.stream.take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.buf.clear();
        self.used = false;
        if *err != BackendError::Down {
            health.record_failure(now_ms, cfg);
        }
    }

    /// Closes a connection that went stale while idle, without blaming the server.
    pub fn reset(&mut self) {
        self.stream = None;
        self.buf.clear();
        self.used = false;
    }

    /// Records that the server answered.
    pub fn succeeded(health: &Health) {
        health.record_success();
    }
}

fn io_error(e: io::Error) -> BackendError {
    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
        BackendError::Timeout
    } else {
        BackendError::Io(e.to_string())
    }
}
