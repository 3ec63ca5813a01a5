//! The listening side of a middleware: binding with a large backlog, and
//! accepting clients — or refusing them with the protocol's answer when the
//! middleware serves as many as it may, or when the process has no file
//! descriptor left (one is kept spare for exactly that moment, so the client
//! hears why instead of waiting in the backlog).

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Duration;

use mio::{Events, Interest, Poll, Registry, Token, Waker};

use crate::start::StartError;
use crate::stream::{bind_unix, unix_listen, Addr, Listener, Stream};
use crate::tls::Session;

/// Connections the kernel completes before the net thread accepts them
/// (std's listeners take 128: a burst of connecting clients overflows it, and
/// each SYN dropped costs its client a second before retrying).
pub const LISTEN_BACKLOG: i32 = 1024;

/// A non-blocking listening socket on `addr` (`host:port`, or a unix
/// socket's `/path [mode]`, see [`crate::stream`]) with a backlog of
/// [`LISTEN_BACKLOG`] (capped by the kernel's `net.core.somaxconn`), and the
/// address it got (useful with port 0).
pub fn bind(addr: &str) -> Result<(Listener, Addr), StartError> {
    let failed = |source| StartError::Listen { addr: addr.to_string(), source };
    let unix = unix_listen(addr).map_err(|why| failed(io::Error::new(io::ErrorKind::InvalidInput, why)))?;
    let l = match unix {
        Some((path, mode)) => {
            let l = bind_unix(&path, mode).map_err(failed)?;
            Listener::Unix(l, path)
        }
        None => Listener::Tcp(std::net::TcpListener::bind(addr).map_err(failed)?),
    };
    let ready = |l: &Listener| -> io::Result<()> {
        // Listening again on a listening socket changes its backlog.
        rustix::net::listen(l, LISTEN_BACKLOG)?;
        l.set_nonblocking(true)
    };
    if let Err(e) = ready(&l) {
        l.remove_file();
        return Err(failed(e));
    }
    let local = l.local_addr()?;
    Ok((l, local))
}

/// The token of the waker in every net thread's poll (shutdown, workers' news).
pub const WAKER: Token = Token(0);
/// The token of the first listening socket in every net thread's poll (a
/// second one, a plaintext listener beside a TLS one, has the next token).
pub const LISTENER: Token = Token(1);
/// Listening sockets a net thread may have.
const MAX_LISTENERS: usize = 2;
/// Client connections' tokens start here.
const FIRST_CLIENT: usize = 1 + MAX_LISTENERS;

/// A net thread's side of the network: its poll (with a waker under
/// [`WAKER`]), its listening sockets (from [`LISTENER`] on; each says
/// whether its clients speak TLS) and its clients.
pub struct Front<T> {
    /// The net thread's poll.
    pub poll: Poll,
    /// Accept (or refuse) clients, and whether those speak TLS.
    acceptors: Vec<(Acceptor, bool)>,
    /// The clients, by token.
    pub clients: Clients<T>,
}

impl<T> Front<T> {
    /// A front on `listeners` (clones of the bound sockets, one per net
    /// thread, each with whether its clients speak TLS); refused clients
    /// hear `refusal`. The waker wakes its poll.
    pub fn new(listeners: Vec<(Listener, bool)>, refusal: &'static [u8]) -> io::Result<(Front<T>, Arc<Waker>)> {
        assert!(listeners.len() <= MAX_LISTENERS, "at most {MAX_LISTENERS} listeners");
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let mut acceptors = Vec::new();
        for (i, (l, tls)) in listeners.into_iter().enumerate() {
            acceptors.push((Acceptor::new(l, poll.registry(), Token(LISTENER.0 + i), refusal)?, tls));
        }
        Ok((Front { poll, acceptors, clients: Clients::default() }, waker))
    }

    /// Whether `token` is one of the listening sockets.
    pub fn is_listener(token: Token) -> bool {
        (LISTENER.0..FIRST_CLIENT).contains(&token.0)
    }

    /// Waits for events, at most `timeout`; false when polling failed for
    /// good (logged), which ends the net thread.
    pub fn wait(&mut self, events: &mut Events, timeout: Option<Duration>) -> bool {
        match self.poll.poll(events, timeout) {
            Err(e) if e.kind() != io::ErrorKind::Interrupted => {
                tracing::error!("poll failed: {e}");
                false
            }
            _ => true,
        }
    }

    /// Accepts every client waiting on every listener (see
    /// [`Acceptor::next`] for `full` and `refused`), keeping what `make`
    /// builds of each (told whether it came through a TLS listener); their tokens.
    pub fn accept(
        &mut self,
        full: impl Fn() -> bool,
        refused: impl FnMut(),
        mut make: impl FnMut(Stream, bool) -> Option<T>,
    ) -> Vec<Token> {
        let mut refused = refused;
        let mut tokens = Vec::new();
        for (acceptor, tls) in &mut self.acceptors {
            while let Some(stream) = acceptor.next(&full, &mut refused) {
                tokens.extend(self.clients.add(self.poll.registry(), stream, |s| make(s, *tls)));
            }
        }
        tokens
    }

    /// Stops accepting (at shutdown).
    pub fn stop_accepting(&mut self) {
        for (acceptor, _) in &mut self.acceptors {
            acceptor.close(self.poll.registry());
        }
    }
}

/// A client connection's bytes: plain, or TLS over the connection. The net
/// thread reads and whoever answers writes, so the TLS state sits behind a
/// lock (each holds it for one read or one write).
pub enum Transport {
    /// Plain bytes.
    Plain(Stream),
    /// TLS over the connection (boxed: a plain connection stays small).
    Tls(Stream, Box<std::sync::Mutex<Session>>),
}

impl Transport {
    /// A connection through a TLS listener configured by `cfg`, or plain.
    pub fn new(stream: Stream, tls: Option<&Arc<rustls::ServerConfig>>) -> io::Result<Transport> {
        Ok(match tls {
            Some(cfg) => Transport::Tls(stream, Box::new(std::sync::Mutex::new(Session::accept(cfg)?))),
            None => Transport::Plain(stream),
        })
    }

    /// The socket (for registration, shutdown, the descriptor).
    pub fn socket(&self) -> &Stream {
        match self {
            Transport::Plain(s) | Transport::Tls(s, _) => s,
        }
    }

    /// Whether it speaks TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(..))
    }

    fn session(&self) -> Option<std::sync::MutexGuard<'_, Session>> {
        match self {
            Transport::Plain(_) => None,
            Transport::Tls(_, s) => Some(s.lock().unwrap_or_else(|p| p.into_inner())),
        }
    }

    /// Whether the TLS handshake is still going on (never, for plain bytes).
    pub fn handshaking(&self) -> bool {
        self.session().is_some_and(|s| s.handshaking())
    }

    /// Reads what the client sent (plaintext); `WouldBlock` when nothing is there.
    pub fn read(&self, out: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => (&*s).read(out),
            Transport::Tls(s, _) => self.session().expect("tls").read(s, out),
        }
    }

    /// Writes what the socket (and, with TLS, the session's buffer) takes.
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => (&*s).write(buf),
            Transport::Tls(s, _) => self.session().expect("tls").write(s, buf),
        }
    }

    /// About how many bytes of replies the TLS session holds for the socket
    /// (0 for plain bytes), counted by the memory budgets as unwritten replies.
    pub fn held(&self) -> usize {
        self.session().map_or(0, |s| s.held())
    }

    /// Writes what the TLS session still holds; true when nothing waits.
    pub fn flush(&self) -> io::Result<bool> {
        match self {
            Transport::Plain(_) => Ok(true),
            Transport::Tls(s, _) => self.session().expect("tls").flush(s),
        }
    }
}

impl Write for &Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Transport::write(self, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Transport::flush(self).map(drop)
    }
}

/// A listening socket the poll watches.
enum Polled {
    Tcp(mio::net::TcpListener),
    Unix(mio::net::UnixListener),
}

impl Polled {
    fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            Polled::Tcp(l) => Stream::Tcp(l.accept()?.0),
            Polled::Unix(l) => Stream::Unix(l.accept()?.0),
        })
    }

    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Polled::Tcp(l) => l,
            Polled::Unix(l) => l,
        }
    }
}

/// Accepts a net thread's clients from the listening socket.
pub struct Acceptor {
    listener: Option<Polled>,
    /// A descriptor given up to accept (and refuse) a client when the
    /// process has none left.
    spare: Option<File>,
    /// What a refused client is told (memcached's or Redis' words).
    refusal: &'static [u8],
}

impl Acceptor {
    /// Registers `listener` (a clone of the bound socket) under `token`;
    /// refused clients are told `refusal`.
    pub fn new(listener: Listener, registry: &Registry, token: Token, refusal: &'static [u8]) -> io::Result<Acceptor> {
        let mut listener = match listener {
            Listener::Tcp(l) => Polled::Tcp(mio::net::TcpListener::from_std(l)),
            Listener::Unix(l, _) => Polled::Unix(mio::net::UnixListener::from_std(l)),
        };
        registry.register(listener.source(), token, Interest::READABLE)?;
        Ok(Acceptor { listener: Some(listener), spare: File::open("/dev/null").ok(), refusal })
    }

    /// The next client to serve, until none waits. A client arriving while
    /// `full()` holds, or when no descriptor is left, is told the refusal,
    /// closed and counted with `refused()`.
    pub fn next(&mut self, full: impl Fn() -> bool, mut refused: impl FnMut()) -> Option<Stream> {
        loop {
            let listener = self.listener.as_ref()?;
            let stream = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if is_out_of_descriptors(&e) => {
                    if !self.refuse_without_descriptors(&mut refused) {
                        return None;
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    return None;
                }
            };
            if full() {
                refused();
                let _ = (&stream).write(self.refusal);
                continue;
            }
            stream.set_nodelay();
            return Some(stream);
        }
    }

    /// The process has no descriptor left for a new client: give up the
    /// spare one, accept the client, refuse it politely, and take the spare
    /// back. False when even that failed (the client waits in the backlog
    /// until a descriptor is free).
    fn refuse_without_descriptors(&mut self, refused: &mut impl FnMut()) -> bool {
        let Some(listener) = self.listener.as_ref() else { return false };
        if self.spare.take().is_none() {
            tracing::warn!("out of file descriptors and no spare one: clients wait in the backlog");
            return false;
        }
        let done = match listener.accept() {
            Ok(stream) => {
                let _ = (&stream).write(self.refusal);
                refused();
                true
            }
            Err(_) => false,
        };
        self.spare = File::open("/dev/null").ok();
        done
    }

    /// Stops accepting (at shutdown); clients still in the backlog are reset.
    pub fn close(&mut self, registry: &Registry) {
        if let Some(mut l) = self.listener.take() {
            let _ = registry.deregister(l.source());
        }
    }
}

/// A net thread's client connections, each under its poll token (from
/// [`FIRST_CLIENT`] on; a closed connection's token is used again).
pub struct Clients<T> {
    slots: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Default for Clients<T> {
    fn default() -> Self {
        Clients { slots: Vec::new(), free: Vec::new() }
    }
}

impl<T> Clients<T> {
    /// Registers `stream` for reading and writing and keeps what `make`
    /// builds of it; its token, or `None` when registering failed (logged)
    /// or `make` gave nothing (the stream is dropped, which closes it).
    pub fn add(
        &mut self,
        registry: &Registry,
        mut stream: Stream,
        make: impl FnOnce(Stream) -> Option<T>,
    ) -> Option<Token> {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        let token = Token(slot + FIRST_CLIENT);
        if let Err(e) = registry.register(&mut stream, token, Interest::READABLE | Interest::WRITABLE) {
            tracing::warn!("register failed: {e}");
            self.free.push(slot);
            return None;
        }
        let Some(client) = make(stream) else {
            self.free.push(slot);
            return None;
        };
        self.slots[slot] = Some(client);
        Some(token)
    }

    /// The connection under `token`.
    pub fn get_mut(&mut self, token: Token) -> Option<&mut T> {
        self.slots.get_mut(token.0.checked_sub(FIRST_CLIENT)?)?.as_mut()
    }

    /// Takes the connection under `token` out; its token is free again.
    pub fn remove(&mut self, token: Token) -> Option<T> {
        let slot = token.0.checked_sub(FIRST_CLIENT)?;
        let c = self.slots.get_mut(slot)?.take()?;
        self.free.push(slot);
        Some(c)
    }

    /// Every connection.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten()
    }

    /// The tokens of every connection.
    pub fn tokens(&self) -> Vec<Token> {
        (0..self.slots.len()).filter(|&i| self.slots[i].is_some()).map(|i| Token(i + FIRST_CLIENT)).collect()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.slots.iter().all(Option::is_none)
    }
}

/// Whether accepting failed because the process or the system has no file
/// descriptor left.
fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(code) if code == rustix::io::Errno::MFILE.raw_os_error()
        || code == rustix::io::Errno::NFILE.raw_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn client_tokens_are_used_again() {
        let (l, addr) = bind("127.0.0.1:0").unwrap();
        let poll = mio::Poll::new().unwrap();
        let mut clients = Clients::default();
        let mut tokens = Vec::new();
        for i in 0..3 {
            let s = Stream::connect(&addr).unwrap();
            tokens.push(clients.add(poll.registry(), s, |_| Some(i)).unwrap());
        }
        assert_eq!(tokens, [Token(3), Token(4), Token(5)]);
        assert_eq!(clients.remove(Token(4)), Some(1));
        assert_eq!(clients.tokens(), [Token(3), Token(5)]);
        let t = clients.add(poll.registry(), Stream::connect(&addr).unwrap(), |_| Some(7)).unwrap();
        assert_eq!((t, clients.get_mut(t).copied()), (Token(4), Some(7)));
        assert_eq!(clients.iter().sum::<i32>(), 9);
        assert!(clients.remove(Token(1)).is_none() && clients.get_mut(Token(99)).is_none());
        drop(l);
    }

    #[test]
    fn clients_over_the_limit_hear_the_refusal() {
        let (l, addr) = bind("127.0.0.1:0").unwrap();
        let poll = mio::Poll::new().unwrap();
        let mut a = Acceptor::new(l, poll.registry(), LISTENER, b"NO\r\n").unwrap();
        let Addr::Tcp(addr) = addr else { panic!("tcp") };
        let first = std::net::TcpStream::connect(addr).unwrap();
        let mut second = std::net::TcpStream::connect(addr).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut refused = 0;
        let mut served = 0;
        let open = std::cell::Cell::new(0);
        while let Some(_s) = a.next(|| open.get() >= 1, || refused += 1) {
            served += 1;
            open.set(open.get() + 1);
        }
        assert_eq!((served, refused), (1, 1));
        let mut answer = String::new();
        second.read_to_string(&mut answer).unwrap();
        assert_eq!(answer, "NO\r\n");
        drop(first);
        a.close(poll.registry());
        assert!(a.next(|| false, || {}).is_none(), "closed: nothing more is accepted");
    }
}
