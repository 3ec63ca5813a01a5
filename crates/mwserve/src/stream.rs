//! Where a peer is and the bytes to it: a TCP address or a unix socket's
//! path, for both sides of a middleware — the clients it accepts (mio,
//! non-blocking) and the servers it reaches (non-blocking for an event loop,
//! blocking for a worker thread).
//!
//! A unix socket is written as its absolute path (`/run/memcached.sock`), as
//! memcached, twemproxy and libmemcached write it; a listening one may add
//! its permissions in octal after a space (`/run/mwproxy.sock 0660`), as
//! twemproxy's `listen` does.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use mio::event::Source;
use mio::{Interest, Registry, Token};

/// A peer's address: TCP, or a unix socket's path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Addr {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A unix socket.
    Unix(PathBuf),
}

impl Addr {
    /// The IP address (none for a unix socket).
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Addr::Tcp(a) => Some(a.ip()),
            Addr::Unix(_) => None,
        }
    }

    /// Whether only this machine reaches it (loopback, or a unix socket).
    pub fn is_local(&self) -> bool {
        self.ip().is_none_or(|ip| ip.is_loopback())
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Tcp(a) => a.fmt(f),
            Addr::Unix(p) => p.display().fmt(f),
        }
    }
}

impl From<SocketAddr> for Addr {
    fn from(a: SocketAddr) -> Addr {
        Addr::Tcp(a)
    }
}

/// Whether `text` names a unix socket (an absolute path) rather than `host:port`.
pub fn is_unix_path(text: &str) -> bool {
    text.starts_with('/')
}

/// A listening address as written: `host:port`, or `/path [mode]` for a unix
/// socket (mode in octal, as `chmod` takes it). The path and mode, or `None`
/// for a TCP address.
pub fn unix_listen(text: &str) -> Result<Option<(PathBuf, Option<u32>)>, String> {
    let text = text.trim();
    if !is_unix_path(text) {
        return Ok(None);
    }
    let (path, mode) = match text.split_once(char::is_whitespace) {
        Some((p, m)) => (p, Some(m.trim())),
        None => (text, None),
    };
    let mode = match mode {
        Some(m) => Some(
            u32::from_str_radix(m, 8)
                .ok()
                .filter(|&m| m <= 0o777)
                .ok_or_else(|| format!("{text:?}: the mode after the path is octal, 0 to 0777 (0660)"))?,
        ),
        None => None,
    };
    Ok(Some((PathBuf::from(path), mode)))
}

/// A connection the poll watches: TCP or a unix socket.
#[derive(Debug)]
pub enum Stream {
    /// TCP.
    Tcp(mio::net::TcpStream),
    /// A unix socket.
    Unix(mio::net::UnixStream),
}

impl Stream {
    /// Starts connecting to `addr` without waiting (the connection is made
    /// when the socket turns writable, see [`Stream::connected`]). A unix
    /// socket whose server's backlog is full fails at once.
    pub fn connect(addr: &Addr) -> io::Result<Stream> {
        Ok(match addr {
            Addr::Tcp(a) => Stream::Tcp(mio::net::TcpStream::connect(*a)?),
            Addr::Unix(p) => Stream::Unix(mio::net::UnixStream::connect(p).map_err(backlog_full)?),
        })
    }

    /// Whether a connection [`Stream::connect`] started is made: `Ok(true)`,
    /// `Ok(false)` while it is still on its way, or why it failed.
    pub fn connected(&self) -> io::Result<bool> {
        if let Some(e) = self.take_error()? {
            return Err(e);
        }
        let peer = match self {
            Stream::Tcp(s) => s.peer_addr().map(drop),
            Stream::Unix(s) => s.peer_addr().map(drop),
        };
        match peer {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The error pending on the socket, if any.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        match self {
            Stream::Tcp(s) => s.take_error(),
            Stream::Unix(s) => s.take_error(),
        }
    }

    /// The client's IP address: a unix socket's clients are local and
    /// count as 127.0.0.1, as loopback clients do.
    pub fn peer_ip(&self) -> Option<IpAddr> {
        match self {
            Stream::Tcp(s) => s.peer_addr().ok().map(|a| a.ip()),
            Stream::Unix(_) => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        }
    }

    /// Where the client is, as failed logins are counted
    /// ([`crate::throttle::Source`]): its IP address (IPv6 by /64), or a
    /// unix socket's client by the user id of its peer credentials
    /// (`SO_PEERCRED`), so that local users do not share one bucket.
    pub fn peer_source(&self) -> Option<crate::throttle::Source> {
        match self {
            Stream::Tcp(s) => s.peer_addr().ok().map(|a| crate::throttle::Source::ip(a.ip())),
            Stream::Unix(s) => peer_uid(s).map(crate::throttle::Source::Uid),
        }
    }

    /// Shuts the connection down.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        }
    }

    /// Sends small writes at once (TCP; a unix socket always does).
    pub fn set_nodelay(&self) {
        if let Stream::Tcp(s) = self {
            let _ = s.set_nodelay(true);
        }
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(s) => (&*s).read(buf),
            Stream::Unix(s) => (&*s).read(buf),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(s) => (&*s).write(buf),
            Stream::Unix(s) => (&*s).write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(s) => (&*s).write_vectored(bufs),
            Stream::Unix(s) => (&*s).write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Source for Stream {
    fn register(&mut self, registry: &Registry, token: Token, interests: Interest) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.register(registry, token, interests),
            Stream::Unix(s) => s.register(registry, token, interests),
        }
    }

    fn reregister(&mut self, registry: &Registry, token: Token, interests: Interest) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.reregister(registry, token, interests),
            Stream::Unix(s) => s.reregister(registry, token, interests),
        }
    }

    fn deregister(&mut self, registry: &Registry) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.deregister(registry),
            Stream::Unix(s) => s.deregister(registry),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
        }
    }
}

/// A blocking connection (a worker thread's to a server): TCP or a unix socket.
#[derive(Debug)]
pub enum BlockingStream {
    /// TCP.
    Tcp(std::net::TcpStream),
    /// A unix socket.
    Unix(std::os::unix::net::UnixStream),
}

impl BlockingStream {
    /// Connects to `addr`, waiting at most `timeout` (a unix socket connects
    /// at once or fails: its server's backlog is full).
    pub fn connect(addr: &Addr, timeout: Duration) -> io::Result<BlockingStream> {
        Ok(match addr {
            Addr::Tcp(a) => {
                let s = std::net::TcpStream::connect_timeout(a, timeout)?;
                let _ = s.set_nodelay(true);
                BlockingStream::Tcp(s)
            }
            Addr::Unix(p) => {
                // Non-blocking, so a server that no longer accepts cannot hold the caller.
                let s = mio::net::UnixStream::connect(p).map_err(backlog_full)?;
                let s = std::os::unix::net::UnixStream::from(std::os::fd::OwnedFd::from(s));
                s.set_nonblocking(false)?;
                BlockingStream::Unix(s)
            }
        })
    }

    /// Sets how long a read waits.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            BlockingStream::Tcp(s) => s.set_read_timeout(t),
            BlockingStream::Unix(s) => s.set_read_timeout(t),
        }
    }

    /// Sets how long a write waits.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            BlockingStream::Tcp(s) => s.set_write_timeout(t),
            BlockingStream::Unix(s) => s.set_write_timeout(t),
        }
    }

    /// Switches between blocking and non-blocking.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            BlockingStream::Tcp(s) => s.set_nonblocking(on),
            BlockingStream::Unix(s) => s.set_nonblocking(on),
        }
    }

    /// Shuts the connection down.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            BlockingStream::Tcp(s) => s.shutdown(how),
            BlockingStream::Unix(s) => s.shutdown(how),
        }
    }
}

impl Read for &BlockingStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match *self {
            BlockingStream::Tcp(s) => (&*s).read(buf),
            BlockingStream::Unix(s) => (&*s).read(buf),
        }
    }
}

impl Write for &BlockingStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match *self {
            BlockingStream::Tcp(s) => (&*s).write(buf),
            BlockingStream::Unix(s) => (&*s).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for BlockingStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            BlockingStream::Tcp(s) => s.as_fd(),
            BlockingStream::Unix(s) => s.as_fd(),
        }
    }
}

/// The user id of a unix socket's peer (the process that connected), as
/// the kernel recorded it at `connect`.
pub fn peer_uid(s: &impl AsFd) -> Option<u32> {
    rustix::net::sockopt::socket_peercred(s).ok().map(|c| c.uid.as_raw())
}

/// A unix socket's connect that would wait: its server's backlog is full.
fn backlog_full(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::ConnectionRefused, "the server's backlog is full")
    } else {
        e
    }
}

/// A bound listening socket: TCP, or a unix socket (whose file is removed
/// when the last clone is dropped by its owner, see [`Listener::remove_file`]).
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(std::net::TcpListener),
    /// A unix socket at its path.
    Unix(std::os::unix::net::UnixListener, PathBuf),
}

impl Listener {
    /// Another handle on the same socket (one per net thread).
    pub fn try_clone(&self) -> io::Result<Listener> {
        Ok(match self {
            Listener::Tcp(l) => Listener::Tcp(l.try_clone()?),
            Listener::Unix(l, p) => Listener::Unix(l.try_clone()?, p.clone()),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<Addr> {
        Ok(match self {
            Listener::Tcp(l) => Addr::Tcp(l.local_addr()?),
            Listener::Unix(_, p) => Addr::Unix(p.clone()),
        })
    }

    /// Switches between blocking and non-blocking.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(on),
            Listener::Unix(l, _) => l.set_nonblocking(on),
        }
    }

    /// Removes a unix socket's file (at shutdown); nothing for TCP.
    pub fn remove_file(&self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l, _) => l.as_fd(),
        }
    }
}

impl From<std::net::TcpListener> for Listener {
    fn from(l: std::net::TcpListener) -> Listener {
        Listener::Tcp(l)
    }
}

/// Binds a unix socket at `path` with `mode` (else what the umask leaves).
/// A socket file left by a process that is gone is replaced; one that a
/// live server answers on, or a file that is not a socket, is refused.
///
/// With a mode, the socket has it from the first moment it exists at
/// `path`: it is bound in a private directory beside `path` (mode 0700, so
/// nobody else can reach it there), given its mode, and renamed into place
/// — memcached sets the umask around `bind` instead, but the umask belongs
/// to the whole process, and another thread creating a file meanwhile
/// would get it too. (A chmod after `bind` at `path` itself left a moment
/// in which a client could connect with the umask's permissions.)
pub fn bind_unix(path: &Path, mode: Option<u32>) -> io::Result<std::os::unix::net::UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "a file that is not a socket is there"));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(io::ErrorKind::AddrInUse, "another process listens on it"));
        }
        std::fs::remove_file(path)?;
    }
    let Some(mode) = mode else { return std::os::unix::net::UnixListener::bind(path) };
    let l = bind_private(path, mode)?;
    // The belt: whatever the rename kept, the mode asked for (a chmod only if it differs).
    if std::fs::metadata(path)?.permissions().mode() & 0o7777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(l)
}

/// Binds in a private directory beside `path`, sets `mode`, renames the
/// socket to `path`.
fn bind_private(path: &Path, mode: u32) -> io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = parent.join(format!(".mw{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    let inner = dir.join("s");
    let bound = std::os::unix::net::UnixListener::bind(&inner).and_then(|l| {
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(mode))?;
        std::fs::rename(&inner, path)?;
        Ok(l)
    });
    let _ = std::fs::remove_file(&inner);
    let _ = std::fs::remove_dir(&dir);
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_read_as_twemproxy_writes_them() {
        assert_eq!(unix_listen("127.0.0.1:1").unwrap(), None);
        assert_eq!(unix_listen("/tmp/a.sock").unwrap(), Some((PathBuf::from("/tmp/a.sock"), None)));
        assert_eq!(unix_listen("/tmp/a.sock 0666").unwrap(), Some((PathBuf::from("/tmp/a.sock"), Some(0o666))));
        assert!(unix_listen("/tmp/a.sock 999").unwrap_err().contains("octal"));
        assert!(unix_listen("/tmp/a.sock 01777").is_err());
    }

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_one_refused() {
        let dir = std::env::temp_dir().join(format!("mwserve-unix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let live = bind_unix(&path, Some(0o600)).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(bind_unix(&path, None).unwrap_err().kind(), io::ErrorKind::AddrInUse);
        drop(live);
        let again = bind_unix(&path, None).unwrap();
        drop(again);
        let file = dir.join("plain");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(bind_unix(&file, None).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&file).unwrap(), b"x", "a file that is not a socket is left alone");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The socket was chmod-ed after `bind`: for a moment it had the
    /// umask's mode at its path. Now it appears there by a rename, already
    /// with its mode: inotify sees it moved in, never created there nor
    /// changed after.
    #[test]
    fn a_unix_socket_appears_with_its_mode() {
        use rustix::fs::inotify;
        let dir = std::env::temp_dir().join(format!("mwserve-unix-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let watch = inotify::init(inotify::CreateFlags::NONBLOCK).unwrap();
        let all = inotify::WatchFlags::CREATE | inotify::WatchFlags::ATTRIB | inotify::WatchFlags::MOVED_TO;
        inotify::add_watch(&watch, &dir, all).unwrap();
        let l = bind_unix(&path, Some(0o640)).unwrap();
        assert_eq!(std::fs::symlink_metadata(&path).unwrap().permissions().mode() & 0o7777, 0o640);
        let mut buf = [std::mem::MaybeUninit::uninit(); 4096];
        let mut events = inotify::Reader::new(&watch, &mut buf);
        let mut seen = Vec::new();
        while let Ok(e) = events.next() {
            if e.file_name().is_some_and(|n| n.to_bytes() == b"s.sock") {
                seen.push(e.events());
            }
        }
        assert_eq!(seen, [inotify::ReadFlags::MOVED_TO], "moved in with its mode, nothing after");
        drop(l);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn blocking_and_polled_streams_carry_bytes_over_a_unix_socket() {
        let dir = std::env::temp_dir().join(format!("mwserve-unix-b-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let l = bind_unix(&path, None).unwrap();
        let addr = Addr::Unix(path.clone());
        assert!(addr.is_local() && addr.ip().is_none());
        let c = BlockingStream::connect(&addr, Duration::from_secs(1)).unwrap();
        let (mut server, _) = l.accept().unwrap();
        (&c).write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        // The server side sees who connected: this process's user.
        assert_eq!(peer_uid(&server), Some(rustix::process::getuid().as_raw()));
        let polled = Stream::connect(&addr).unwrap();
        assert!(polled.connected().unwrap());
        assert_eq!(polled.peer_ip(), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let uid = rustix::process::getuid().as_raw();
        assert_eq!(polled.peer_source(), Some(crate::throttle::Source::Uid(uid)), "by uid, not as 127.0.0.1");
        drop(l);
        std::fs::remove_file(&path).unwrap();
        let gone = BlockingStream::connect(&addr, Duration::from_secs(1)).unwrap_err();
        assert_eq!(gone.kind(), io::ErrorKind::NotFound);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
