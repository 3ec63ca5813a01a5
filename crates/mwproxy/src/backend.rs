//! A pool worker's blocking connection to one memcached server: bytes in and
//! out (through TLS when the servers speak it), nothing else. What may be sent, how long to wait and what a failure
//! means is the [`Exchange`](crate::exchange::Exchange)'s business.
//!
//! Each worker owns one per server, so a batch's requests are written to all
//! servers involved before any reply is read. A connection that fails is
//! closed and never reused, because a late reply would be taken for the
//! answer to the next request. To avoid failing requests on a connection that
//! the server closed while it sat idle (a restart), an idle connection is
//! checked without blocking before it is used again, and opened anew if the
//! server has gone. Every wait is bounded by the limit the caller gives.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcproto::ReadBuf;
use mwserve::stream::{Addr, BlockingStream};
use mwserve::tls::{quiet, Session};
use rustls::pki_types::ServerName;

use crate::route::BackendError;

/// How a new connection speaks TLS, if it does: the configuration and the
/// name the server's certificate must carry.
pub type Tls = Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>;

const READ_CHUNK: usize = 64 * 1024;
/// A connection idle for this long is checked before it is used again.
const IDLE_CHECK: Duration = Duration::from_millis(200);

/// A worker's connection to one server.
pub struct Backend {
    addr: Addr,
    stream: Option<BlockingStream>,
    /// The TLS session of the open connection.
    session: Option<Session>,
    /// Bytes read but not yet consumed.
    buf: ReadBuf,
    /// The socket timeouts currently set.
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    /// When the connection was last used.
    last_used: Instant,
}

impl Backend {
    /// A connection to be opened on first use.
    pub fn new(addr: Addr) -> Backend {
        Backend {
            addr,
            stream: None,
            session: None,
            buf: ReadBuf::with_capacity(READ_CHUNK),
            read_timeout: None,
            write_timeout: None,
            last_used: Instant::now(),
        }
    }

    /// Opens the connection if needed, or anew if the server closed it while
    /// idle, with TLS when `tls` says how; true when a new connection was made.
    pub fn open(&mut self, connect_timeout: Duration, tls: impl FnOnce() -> Tls) -> Result<bool, BackendError> {
        if self.stream.is_some() && self.last_used.elapsed() >= IDLE_CHECK && !self.alive() {
            self.close();
        }
        if self.stream.is_some() {
            return Ok(false);
        }
        let s =
            BlockingStream::connect(&self.addr, connect_timeout).map_err(|e| BackendError::Connect(e.to_string()))?;
        self.session = match tls() {
            Some((cfg, name)) => Some(Session::connect(&cfg, name).map_err(|e| BackendError::Connect(e.to_string()))?),
            None => None,
        };
        self.stream = Some(s);
        self.read_timeout = None;
        self.write_timeout = None;
        self.buf.clear();
        Ok(true)
    }

    /// Whether an idle connection is still open at the server's end: no
    /// bytes and no end of stream waiting (checked without blocking).
    fn alive(&mut self) -> bool {
        let Some(s) = &self.stream else { return false };
        let mut probe = [0u8; 1];
        let Some(session) = self.session.as_mut() else {
            let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
            return matches!(rustix::net::recv(s, &mut probe[..], flags), Err(rustix::io::Errno::AGAIN));
        };
        // TLS: what arrived while idle may be records for the session (a
        // ticket, a close_notify): let the session read them, without waiting.
        if s.set_nonblocking(true).is_err() {
            return false;
        }
        let idle = matches!(session.read(s, &mut probe), Err(e) if quiet(&e));
        idle && s.set_nonblocking(false).is_ok()
    }

    /// Writes some of `bytes`, waiting at most `limit`: the bytes written, or
    /// `None` when the socket took nothing in that time.
    pub fn write(&mut self, bytes: &[u8], limit: Duration) -> Result<Option<usize>, BackendError> {
        let limit = whole_ms(limit);
        let stream = self.stream.as_mut().ok_or(BackendError::Down)?;
        if self.write_timeout != Some(limit) {
            stream.set_write_timeout(Some(limit)).map_err(io_error)?;
            self.write_timeout = Some(limit);
        }
        loop {
            let written = match self.session.as_mut() {
                Some(session) => session.write(&*stream, bytes),
                None => (&*stream).write(bytes),
            };
            return match written {
                Ok(0) => Err(BackendError::Io("closed by server".into())),
                Ok(n) => {
                    self.last_used = Instant::now();
                    Ok(Some(n))
                }
                Err(e) if quiet(&e) => Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(io_error(e)),
            };
        }
    }

    /// Pushes out what the TLS session still holds of what was written,
    /// waiting at most `limit`; true when nothing is left (always, without TLS).
    pub fn push(&mut self, limit: Duration) -> Result<bool, BackendError> {
        let limit = whole_ms(limit);
        let (Some(stream), Some(session)) = (self.stream.as_mut(), self.session.as_mut()) else { return Ok(true) };
        if self.write_timeout != Some(limit) {
            stream.set_write_timeout(Some(limit)).map_err(io_error)?;
            self.write_timeout = Some(limit);
        }
        session.flush(&*stream).map_err(io_error)
    }

    /// Reads what the server sent into the buffer, waiting at most `limit`:
    /// the bytes read, or `None` when nothing came in that time.
    pub fn read(&mut self, limit: Duration) -> Result<Option<usize>, BackendError> {
        let limit = whole_ms(limit);
        let stream = self.stream.as_mut().ok_or(BackendError::Down)?;
        if self.read_timeout != Some(limit) {
            stream.set_read_timeout(Some(limit)).map_err(io_error)?;
            self.read_timeout = Some(limit);
        }
        self.buf.shrink_to(READ_CHUNK);
        loop {
            let spare = self.buf.spare(READ_CHUNK / 4);
            let read = match self.session.as_mut() {
                Some(session) => session.read(&*stream, spare),
                None => (&*stream).read(spare),
            };
            return match read {
                Ok(0) => Err(BackendError::Io("closed by server".into())),
                Ok(n) => {
                    self.buf.commit(n);
                    self.last_used = Instant::now();
                    Ok(Some(n))
                }
                Err(e) if quiet(&e) => Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(io_error(e)),
            };
        }
    }

    /// The bytes read and not yet consumed.
    pub fn buffered(&self) -> &[u8] {
        self.buf.filled()
    }

    /// Drops `len` bytes of replies that have been used.
    pub fn consume(&mut self, len: usize) {
        self.buf.consume(len.min(self.buf.len()));
    }

    /// Closes the connection and forgets what it buffered.
    pub fn close(&mut self) {
        if let Some(s) = self.stream.take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.session = None;
        self.buf.clear();
        self.buf.shrink_to(READ_CHUNK);
    }

    /// Whether a connection is open.
    pub fn is_open(&self) -> bool {
        self.stream.is_some()
    }
}

/// A wait rounded up to whole milliseconds, so that the socket timeout is set
/// once per connection, not before every read.
fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis((d.as_nanos().div_ceil(1_000_000) as u64).max(1))
}

fn io_error(e: io::Error) -> BackendError {
    if quiet(&e) {
        BackendError::Timeout
    } else if e.kind() == io::ErrorKind::InvalidData {
        BackendError::Protocol(e.to_string())
    } else {
        BackendError::Io(e.to_string())
    }
}
