//! Noticing that a client left while its request waits (`RECV ... WAIT`,
//! `XREAD`/`XREADGROUP ... BLOCK`): nobody reads a client's socket while its
//! request is being answered, so a client that closed would only be noticed
//! when its reply is written — for a wait, minutes later, or never.
//!
//! The async engine reads the socket while the request waits
//! ([`while_waiting`]): what the client pipelines meanwhile is kept for
//! after the reply (up to [`READ_AHEAD`] bytes), the end of its input or a
//! failure ends the wait ([`Left`]). The pool engine's net thread watches
//! the socket as it does for any connection (`net.rs`). Both ask the socket
//! once more before writing a waited-for reply ([`hung_up`]): a client that
//! left just as its message came gets no reply written into the void, and
//! the leases it carried go back at once.

use std::cell::Cell;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes a waiting client may send ahead of its reply and have read: the
/// largest a client's read buffer grows to anyway (`aio.rs`), so that
/// 10,000 waiting clients that pipeline hold 160 MiB at most.
pub const READ_AHEAD: usize = 16 * 1024;

/// How often a waiting client that filled [`READ_AHEAD`] is asked whether
/// it left (its socket is not read any more, so its end is not seen).
const ASK_EVERY: Duration = Duration::from_millis(500);

/// Bytes of replies a TCP socket keeps unsent in the kernel
/// (`TCP_NOTSENT_LOWAT`; see [`limit_unsent`]).
pub const UNSENT: u32 = 64 * 1024;

/// Keeps at most [`UNSENT`] bytes of `socket`'s replies waiting in the
/// kernel, beside what the client's receive window takes. Without it
/// Linux grows a socket's send buffer to 4 MiB, and mwmq's writes into it
/// stop for as long as the client takes to read a third of that: a client
/// reading 62 KB/s made no progress mwmq could see for 20 s and was closed
/// as a stalled reader (`output.rs`). With it a write goes through each
/// time the client took half of [`UNSENT`]. (Not a TCP socket, or not
/// Linux: left as it is.)
pub fn limit_unsent(socket: BorrowedFd<'_>) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = socket2::SockRef::from(&socket).set_tcp_notsent_lowat(UNSENT);
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = socket;
}

/// Whether the peer of `socket` closed its side or the connection failed.
/// Asked without reading: input not read yet does not hide it (POLLRDHUP).
pub fn hung_up(socket: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&socket, PollFlags::RDHUP)];
    let now = Timespec { tv_sec: 0, tv_nsec: 0 };
    match poll(&mut fds, Some(&now)) {
        Ok(n) if n > 0 => fds[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR),
        _ => false,
    }
}

/// A socket whose descriptor can be asked [`hung_up`].
pub trait Socket {
    /// The TCP socket underneath.
    fn socket(&self) -> BorrowedFd<'_>;
}

impl Socket for tokio::net::TcpStream {
    fn socket(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
}

impl Socket for tokio_rustls::server::TlsStream<tokio::net::TcpStream> {
    fn socket(&self) -> BorrowedFd<'_> {
        self.get_ref().0.as_fd()
    }
}

/// Set when a waiting request's client left: the wait ends.
#[derive(Default)]
pub struct Left {
    gone: Cell<bool>,
    told: tokio::sync::Notify,
}

impl Left {
    /// The client left.
    pub fn set(&self) {
        self.gone.set(true);
        self.told.notify_waiters();
    }

    /// Whether the client left.
    pub fn is_set(&self) -> bool {
        self.gone.get()
    }

    /// Returns once the client left.
    pub async fn wait(&self) {
        loop {
            let told = self.told.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if self.is_set() {
                return;
            }
            told.await;
        }
    }
}

/// A connection's input buffer: `buf[pos..have]` is read and not yet parsed.
pub struct Input<'a> {
    /// The buffer.
    pub buf: &'a mut Vec<u8>,
    /// Where parsing goes on.
    pub pos: &'a mut usize,
    /// The end of what was read.
    pub have: &'a mut usize,
}

impl Input<'_> {
    /// Room at the end for another read (moving the unparsed bytes to the
    /// front, or growing up to [`READ_AHEAD`]): none when that much waits.
    fn room(&mut self) -> Option<&mut [u8]> {
        if *self.have == self.buf.len() {
            if *self.pos > 0 {
                self.buf.copy_within(*self.pos..*self.have, 0);
                *self.have -= *self.pos;
                *self.pos = 0;
            } else if self.buf.len() < READ_AHEAD {
                let more = (self.buf.len() * 2).clamp(512, READ_AHEAD);
                self.buf.resize(more, 0);
            } else {
                return None;
            }
        }
        Some(&mut self.buf[*self.have..])
    }
}

/// Runs `work` (a waiting request) while reading what its client sends:
/// bytes are kept in `input` for after the reply; the end of the input or a
/// failure sets `left`, and `work` is expected to end soon after (it waits
/// on `left`). Past [`READ_AHEAD`] bytes the socket is only asked, every
/// [`ASK_EVERY`], whether the client left. `work`'s result.
pub async fn while_waiting<IO, T>(
    work: impl std::future::Future<Output = T>,
    io: &mut IO,
    input: &mut Input<'_>,
    left: &Left,
) -> T
where
    IO: AsyncRead + Socket + Unpin,
{
    tokio::pin!(work);
    loop {
        if left.is_set() {
            return work.await;
        }
        match input.room() {
            Some(room) => {
                tokio::select! {
                    biased;
                    out = &mut work => return out,
                    r = io.read(room) => match r {
                        Ok(0) | Err(_) => left.set(),
                        Ok(n) => *input.have += n,
                    },
                }
            }
            None => {
                tokio::select! {
                    biased;
                    out = &mut work => return out,
                    _ = tokio::time::sleep(ASK_EVERY) => {
                        if hung_up(io.socket()) {
                            left.set();
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_keeps_what_is_not_parsed_and_stops_at_the_bound() {
        let mut buf = b"PING\r\nRE".to_vec();
        let (mut pos, mut have) = (6, 8);
        let mut input = Input { buf: &mut buf, pos: &mut pos, have: &mut have };
        let room = input.room().expect("room");
        assert_eq!(room.len(), 6, "the unparsed bytes moved to the front");
        assert_eq!((pos, have), (0, 2));
        assert_eq!(&buf[..2], b"RE");
        let mut input = Input { buf: &mut buf, pos: &mut pos, have: &mut have };
        have_all(&mut input);
        assert!(input.room().is_none(), "no more than READ_AHEAD bytes are held");
        assert_eq!(buf.len(), READ_AHEAD);
    }

    fn have_all(input: &mut Input<'_>) {
        while let Some(room) = input.room() {
            let n = room.len();
            *input.have += n;
        }
    }

    #[test]
    fn a_closed_peer_is_seen_without_reading() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        assert!(!hung_up(s.as_fd()));
        use std::io::Write;
        (&c).write_all(b"unread").unwrap();
        assert!(!hung_up(s.as_fd()), "data is not a close");
        drop(c);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !hung_up(s.as_fd()) {
            assert!(std::time::Instant::now() < deadline, "the close was not seen behind unread data");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
