//! A pool worker's blocking connection to one memcached server.
//!
//! Each worker owns one per server, so a batch's requests are written to all
//! servers involved before any reply is read. A connection that fails
//! (refused, reset, timed out, given up, or answered with bytes that are not
//! memcached replies) is closed and never reused, because a late reply would
//! be taken for the answer to the next request. Nothing is ever sent twice: a
//! request that may have reached the server is answered with `SERVER_ERROR`
//! when its connection fails. To avoid failing requests on a connection that
//! the server closed while it sat idle (a restart), an idle connection is
//! checked without blocking before it is used again, and opened anew if the
//! server has gone.
//!
//! Waiting for a reply is bounded by a deadline, not by a timeout per read,
//! and is cut into slices so the worker can notice that the server stalled
//! (see `health.rs`): then it either becomes the server's probe and waits on,
//! or gives the request up at once.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use mcproto::ReadBuf;

use crate::config::BackendConfig;
use crate::health::Health;
use crate::route::{BackendError, Framing};

const READ_CHUNK: usize = 64 * 1024;
/// A connection idle for this long is checked before it is used again.
const IDLE_CHECK: Duration = Duration::from_millis(200);

/// A worker's connection to one server.
pub struct Backend {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    /// Bytes read but not yet consumed.
    buf: ReadBuf,
    /// The socket timeouts currently set.
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    /// When the connection was last used.
    last_used: Instant,
    /// The connection failed: drop it once its buffered replies are consumed.
    broken: bool,
    /// Reconnections made after a failure, not yet counted in the stats.
    reconnects: u64,
}

impl Backend {
    /// A connection to be opened on first use.
    pub fn new(addr: SocketAddr) -> Backend {
        Backend {
            addr,
            stream: None,
            buf: ReadBuf::with_capacity(READ_CHUNK),
            read_timeout: None,
            write_timeout: None,
            last_used: Instant::now(),
            broken: false,
            reconnects: 0,
        }
    }

    /// Reconnections since the last call (for the stats).
    pub fn take_reconnects(&mut self) -> u64 {
        std::mem::take(&mut self.reconnects)
    }

    /// Opens the connection if needed, or anew if the server closed it while idle.
    pub fn ensure(&mut self, cfg: &BackendConfig, after_failure: bool) -> Result<(), BackendError> {
        if self.stream.is_some() && self.last_used.elapsed() >= IDLE_CHECK && !self.alive() {
            self.drop_stream();
        }
        if self.stream.is_some() {
            return Ok(());
        }
        let timeout = Duration::from_millis(cfg.connect_timeout_ms);
        let s = TcpStream::connect_timeout(&self.addr, timeout).map_err(|e| BackendError::Connect(e.to_string()))?;
        let _ = s.set_nodelay(true);
        if after_failure {
            self.reconnects += 1;
        }
        self.stream = Some(s);
        self.read_timeout = None;
        self.write_timeout = None;
        self.buf.clear();
        self.broken = false;
        Ok(())
    }

    /// Whether an idle connection is still open at the server's end: no
    /// bytes and no end of stream waiting (checked without blocking).
    fn alive(&self) -> bool {
        let Some(s) = &self.stream else { return false };
        let mut probe = [0u8; 1];
        let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
        matches!(rustix::net::recv(s, &mut probe[..], flags), Err(rustix::io::Errno::AGAIN))
    }

    /// Writes `bytes` whole before `deadline` (see [`Wait`]).
    pub fn send(&mut self, bytes: &[u8], wait: &mut Wait<'_>) -> Result<(), BackendError> {
        let mut written = 0;
        while written < bytes.len() {
            let slice = wait.slice()?;
            let stream = self.stream.as_mut().ok_or(BackendError::Down)?;
            if self.write_timeout != Some(slice) {
                stream.set_write_timeout(Some(slice)).map_err(io_error)?;
                self.write_timeout = Some(slice);
            }
            match stream.write(&bytes[written..]) {
                Ok(0) => return Err(BackendError::Io("closed by server".into())),
                Ok(n) => written += n,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => wait.quiet()?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(e)),
            }
        }
        self.last_used = Instant::now();
        Ok(())
    }

    /// Reads until a whole reply, as `framing` delimits it, is buffered at
    /// offset `at`, and returns its length (it stays buffered until
    /// [`Backend::consume`]). Gives up with `TooLarge` past `cap` bytes, and
    /// as [`Wait`] decides when the server is quiet.
    pub fn recv(
        &mut self,
        at: usize,
        framing: Framing,
        cap: usize,
        wait: &mut Wait<'_>,
    ) -> Result<usize, BackendError> {
        loop {
            let filled = &self.buf.filled()[at..];
            match framing(filled) {
                Ok(Some(n)) => return Ok(n),
                Ok(None) if filled.len() > cap => return Err(BackendError::TooLarge),
                Ok(None) => {}
                Err(e) => return Err(BackendError::Protocol(e.to_string())),
            }
            let slice = wait.slice()?;
            let stream = self.stream.as_mut().ok_or(BackendError::Down)?;
            if self.read_timeout != Some(slice) {
                stream.set_read_timeout(Some(slice)).map_err(io_error)?;
                self.read_timeout = Some(slice);
            }
            match stream.read(self.buf.spare(READ_CHUNK / 4)) {
                Ok(0) => return Err(BackendError::Io("closed by server".into())),
                Ok(n) => {
                    self.buf.commit(n);
                    self.last_used = Instant::now();
                    wait.progress();
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => wait.quiet()?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(e)),
            }
        }
    }

    /// The buffered reply of `len` bytes at offset `at`.
    pub fn reply(&self, at: usize, len: usize) -> &[u8] {
        &self.buf.filled()[at..at + len]
    }

    /// Drops `len` bytes of replies that have been used; after a failure,
    /// everything, and the connection with it.
    pub fn consume(&mut self, len: usize) {
        if self.broken {
            self.buf.clear();
            self.buf.shrink_to(READ_CHUNK);
            self.broken = false;
            return;
        }
        self.buf.consume(len.min(self.buf.len()));
        self.buf.shrink_to(READ_CHUNK);
    }

    /// Closes the connection after a failure; replies already buffered stay
    /// readable until [`Backend::consume`].
    pub fn fail(&mut self) {
        self.drop_stream();
        self.broken = true;
    }

    fn drop_stream(&mut self) {
        if let Some(s) = self.stream.take() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Whether a connection is open.
    pub fn is_open(&self) -> bool {
        self.stream.is_some()
    }
}

/// How long a worker waits for one server, and what it does when the
/// server is quiet: it waits in slices of `stall_ms` (the last one cut to the
/// deadline); after a quiet slice it checks whether the server counts as
/// stalled, and if so either becomes its probe and waits on until the
/// deadline, or gives the request up at once.
pub struct Wait<'a> {
    /// The servers' shared health.
    pub health: &'a Health,
    /// Which server.
    pub server: usize,
    /// When to give up with `Timeout`.
    pub deadline: Instant,
    /// Longest single wait before the stall check.
    pub slice: Duration,
    /// Whether this worker is the server's probe (set when it becomes one).
    pub probe: &'a mut bool,
}

impl Wait<'_> {
    /// The next wait: a slice, or what is left before the deadline.
    fn slice(&self) -> Result<Duration, BackendError> {
        let now = Instant::now();
        if now >= self.deadline {
            return Err(BackendError::Timeout);
        }
        // Rounded to whole milliseconds so that the socket timeout is set
        // once per connection, not before every read.
        let left = Duration::from_millis(((self.deadline - now).as_millis() as u64).max(1));
        Ok(left.min(self.slice))
    }

    fn progress(&self) {
        self.health.progress(self.server);
    }

    /// Nothing came for a whole slice.
    fn quiet(&mut self) -> Result<(), BackendError> {
        if Instant::now() >= self.deadline {
            return Err(BackendError::Timeout);
        }
        if !*self.probe && self.health.stalled(self.server, self.health.now_ms()) {
            if !self.health.claim_probe(self.server) {
                return Err(BackendError::Stalled);
            }
            *self.probe = true;
        }
        Ok(())
    }
}

fn io_error(e: io::Error) -> BackendError {
    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
        BackendError::Timeout
    } else {
        BackendError::Io(e.to_string())
    }
}
