//! The listening side of a middleware: binding with a large backlog, and
//! accepting clients — or refusing them with the protocol's answer when the
//! middleware serves as many as it may, or when the process has no file
//! descriptor left (one is kept spare for exactly that moment, so the client
//! hears why instead of waiting in the backlog).

use std::fs::File;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};

use crate::start::StartError;

/// Connections the kernel completes before the net thread accepts them
/// (std's listeners take 128: a burst of connecting clients overflows it, and
/// each SYN dropped costs its client a second before retrying).
pub const LISTEN_BACKLOG: i32 = 1024;

/// A non-blocking listening socket on `addr` with a backlog of
/// [`LISTEN_BACKLOG`] (capped by the kernel's `net.core.somaxconn`), and the
/// address it got (useful with port 0).
pub fn bind(addr: &str) -> Result<(std::net::TcpListener, SocketAddr), StartError> {
    let listen = |addr: &str| -> io::Result<std::net::TcpListener> {
        let l = std::net::TcpListener::bind(addr)?;
        // Listening again on a listening socket changes its backlog.
        rustix::net::listen(&l, LISTEN_BACKLOG)?;
        l.set_nonblocking(true)?;
        Ok(l)
    };
    let l = listen(addr).map_err(|source| StartError::Listen { addr: addr.to_string(), source })?;
    let local = l.local_addr()?;
    Ok((l, local))
}

/// The token of the waker in every net thread's poll (shutdown, workers' news).
pub const WAKER: Token = Token(0);
/// The token of the listening socket in every net thread's poll.
pub const LISTENER: Token = Token(1);
/// Client connections' tokens start here.
const FIRST_CLIENT: usize = 2;

/// A net thread's side of the network: its poll (with a waker under
/// [`WAKER`]), the listening socket (under [`LISTENER`]) and its clients.
pub struct Front<T> {
    /// The net thread's poll.
    pub poll: Poll,
    /// Accepts (or refuses) clients.
    pub acceptor: Acceptor,
    /// The clients, by token.
    pub clients: Clients<T>,
}

impl<T> Front<T> {
    /// A front on `listener` (a clone of the bound socket, one per net
    /// thread); refused clients hear `refusal`. The waker wakes its poll.
    pub fn new(listener: std::net::TcpListener, refusal: &'static [u8]) -> io::Result<(Front<T>, Arc<Waker>)> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let acceptor = Acceptor::new(listener, poll.registry(), LISTENER, refusal)?;
        Ok((Front { poll, acceptor, clients: Clients::default() }, waker))
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

    /// Accepts every client waiting (see [`Acceptor::next`] for `full` and
    /// `refused`), keeping what `make` builds of each; their tokens.
    pub fn accept(
        &mut self,
        full: impl Fn() -> bool,
        refused: impl FnMut(),
        mut make: impl FnMut(TcpStream) -> T,
    ) -> Vec<Token> {
        let mut refused = refused;
        let mut tokens = Vec::new();
        while let Some(stream) = self.acceptor.next(&full, &mut refused) {
            tokens.extend(self.clients.add(self.poll.registry(), stream, &mut make));
        }
        tokens
    }

    /// Stops accepting (at shutdown).
    pub fn stop_accepting(&mut self) {
        self.acceptor.close(self.poll.registry());
    }
}

/// Accepts a net thread's clients from the listening socket.
pub struct Acceptor {
    listener: Option<TcpListener>,
    /// A descriptor given up to accept (and refuse) a client when the
    /// process has none left.
    spare: Option<File>,
    /// What a refused client is told (memcached's or Redis' words).
    refusal: &'static [u8],
}

impl Acceptor {
    /// Registers `listener` (a clone of the bound socket) under `token`;
    /// refused clients are told `refusal`.
    pub fn new(
        listener: std::net::TcpListener,
        registry: &Registry,
        token: Token,
        refusal: &'static [u8],
    ) -> io::Result<Acceptor> {
        let mut listener = TcpListener::from_std(listener);
        registry.register(&mut listener, token, Interest::READABLE)?;
        Ok(Acceptor { listener: Some(listener), spare: File::open("/dev/null").ok(), refusal })
    }

    /// The next client to serve, until none waits. A client arriving while
    /// `full()` holds, or when no descriptor is left, is told the refusal,
    /// closed and counted with `refused()`.
    pub fn next(&mut self, full: impl Fn() -> bool, mut refused: impl FnMut()) -> Option<TcpStream> {
        loop {
            let listener = self.listener.as_ref()?;
            let mut stream = match listener.accept() {
                Ok((s, _)) => s,
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
                let _ = stream.write(self.refusal);
                continue;
            }
            let _ = stream.set_nodelay(true);
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
            Ok((mut stream, _)) => {
                let _ = stream.write(self.refusal);
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
            let _ = registry.deregister(&mut l);
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
    /// builds of it; its token, or `None` when registering failed (logged:
    /// the stream is dropped, which closes it).
    pub fn add(
        &mut self,
        registry: &Registry,
        mut stream: TcpStream,
        make: impl FnOnce(TcpStream) -> T,
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
        self.slots[slot] = Some(make(stream));
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
            let s = TcpStream::connect(addr).unwrap();
            tokens.push(clients.add(poll.registry(), s, |_| i).unwrap());
        }
        assert_eq!(tokens, [Token(2), Token(3), Token(4)]);
        assert_eq!(clients.remove(Token(3)), Some(1));
        assert_eq!(clients.tokens(), [Token(2), Token(4)]);
        let t = clients.add(poll.registry(), TcpStream::connect(addr).unwrap(), |_| 7).unwrap();
        assert_eq!((t, clients.get_mut(t).copied()), (Token(3), Some(7)));
        assert_eq!(clients.iter().sum::<i32>(), 9);
        assert!(clients.remove(Token(1)).is_none() && clients.get_mut(Token(99)).is_none());
        drop(l);
    }

    #[test]
    fn clients_over_the_limit_hear_the_refusal() {
        let (l, addr) = bind("127.0.0.1:0").unwrap();
        let poll = mio::Poll::new().unwrap();
        let mut a = Acceptor::new(l, poll.registry(), LISTENER, b"NO\r\n").unwrap();
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
