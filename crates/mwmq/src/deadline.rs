//! A deadline on every database statement, enforced from outside the
//! client library: a database that stops answering without closing its
//! connections (a frozen server, a partition) would otherwise hold every
//! worker whose statement was sent, for as long as it stays silent — the
//! `postgres` crate has no per-statement timeout, and PostgreSQL's own
//! `statement_timeout` needs a server that runs.
//!
//! When a connection is opened, the socket it uses is found (the one new
//! socket to the database's address; connections are opened one at a time
//! for this) and a duplicate of it kept (`pidfd_getfd`: no unsafe code). A
//! worker arms its connection's deadline before its statements and disarms
//! it after; a watchdog thread that finds an armed deadline passed shuts the
//! socket down, so the blocked call returns at once with an error, the
//! request is answered `-TRYAGAIN`, the worker is free and the connection is
//! dropped (the server rolls the statement back when it runs again). A
//! connection whose socket could not be told apart has no deadline (logged).
//! Only mwmq's own connections may open database sockets in its process
//! while it connects: code beside it that did (a test running mwmq in its
//! own process, with SQL connections of its own) could see one of its
//! sockets taken for mwmq's and cut at a deadline; such tests open their
//! connections before mwmq starts.

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// One connection's socket and the deadline of its statement in flight.
#[derive(Debug)]
pub struct Armed {
    socket: OwnedFd,
    /// Milliseconds since the watch started; 0: nothing in flight.
    deadline_ms: AtomicU64,
}

impl Armed {
    /// Shuts its socket down now.
    pub fn cut(&self) {
        cut(&self.socket);
    }
}

/// Every connection's deadline, and the thread that enforces them.
#[derive(Debug)]
pub struct Watch {
    started: Instant,
    armed: Mutex<Vec<Weak<Armed>>>,
    /// Statements cut short since start.
    pub cut: AtomicU64,
}

/// Connections are opened one at a time, so that each one's socket is the
/// one new socket to the database.
pub static OPENING: Mutex<()> = Mutex::new(());

impl Watch {
    /// A watch with its thread (which ends when the watch is dropped).
    pub fn start() -> Arc<Watch> {
        let w = Arc::new(Watch { started: Instant::now(), armed: Mutex::new(Vec::new()), cut: AtomicU64::new(0) });
        let weak = Arc::downgrade(&w);
        let _ = std::thread::Builder::new().name("db-deadline".into()).spawn(move || {
            while let Some(w) = weak.upgrade() {
                w.enforce();
                drop(w);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        w
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64 + 1
    }

    /// Watches `socket` (a duplicate of a connection's).
    pub fn watch(&self, socket: OwnedFd) -> Arc<Armed> {
        let a = Arc::new(Armed { socket, deadline_ms: AtomicU64::new(0) });
        let mut v = self.armed.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(&a));
        a
    }

    /// Arms `a`: its statements must be answered within `limit`.
    pub fn arm(&self, a: &Armed, limit: Duration) {
        a.deadline_ms.store(self.now_ms() + limit.as_millis() as u64, Ordering::Relaxed);
    }

    /// Nothing in flight on `a` any more.
    pub fn disarm(&self, a: &Armed) {
        a.deadline_ms.store(0, Ordering::Relaxed);
    }

    fn enforce(&self) {
        let now = self.now_ms();
        let armed: Vec<Arc<Armed>> =
            self.armed.lock().unwrap_or_else(|p| p.into_inner()).iter().filter_map(Weak::upgrade).collect();
        for a in armed {
            let d = a.deadline_ms.load(Ordering::Relaxed);
            if d != 0 && now >= d && a.deadline_ms.compare_exchange(d, 0, Ordering::Relaxed, Ordering::Relaxed).is_ok()
            {
                cut(&a.socket);
                let n = self.cut.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!("the database did not answer a statement in time: connection cut ({n} so far)");
                }
            }
        }
    }
}

/// Shuts a socket down: whoever waits on it wakes with an error.
pub fn cut(socket: &impl AsFd) {
    let _ = rustix::net::shutdown(socket, rustix::net::Shutdown::Both);
}

/// This process's open sockets: each one's descriptor number and the
/// socket's inode (`socket:[inode]`), so that a socket opened on a number
/// another one freed in between still counts as new.
pub fn sockets() -> HashSet<(RawFd, String)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return HashSet::new() };
    dir.flatten()
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?.to_string_lossy().into_owned();
            let fd = e.file_name().to_str()?.parse().ok()?;
            target.starts_with("socket:").then_some((fd, target))
        })
        .collect()
}

/// Of the sockets in `after` but not in `before`, the one whose peer is the
/// database (a Unix socket, or a TCP one to one of `ports`), duplicated.
pub fn new_socket(
    before: &HashSet<(RawFd, String)>,
    after: &HashSet<(RawFd, String)>,
    ports: &[u16],
) -> Option<OwnedFd> {
    let me = rustix::process::pidfd_open(rustix::process::getpid(), rustix::process::PidfdFlags::empty()).ok()?;
    let mut found: Vec<OwnedFd> = after
        .difference(before)
        .filter_map(|(fd, _)| rustix::process::pidfd_getfd(&me, *fd, rustix::process::PidfdGetfdFlags::empty()).ok())
        .filter(|s| match rustix::net::getpeername(s) {
            Ok(Some(addr)) => match addr.address_family() {
                rustix::net::AddressFamily::UNIX => true,
                rustix::net::AddressFamily::INET | rustix::net::AddressFamily::INET6 => {
                    std::net::SocketAddr::try_from(addr).is_ok_and(|a| ports.contains(&a.port()))
                }
                _ => false,
            },
            _ => false,
        })
        .collect();
    (found.len() == 1).then(|| found.pop()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::{UnixListener, UnixStream};

    /// A database connection opened on the descriptor number another socket
    /// freed just before is still the new one (numbers alone missed it).
    #[test]
    fn a_socket_on_a_reused_descriptor_number_is_found_as_new() {
        let dir = std::env::temp_dir().join(format!("mwmq-deadline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("db.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let old = UnixStream::connect(&path).unwrap();
        let (_old_peer, _) = listener.accept().unwrap();
        let number = old.as_raw_fd();
        let before = sockets();
        drop(old);
        let new = UnixStream::connect(&path).unwrap();
        let after = sockets();
        let found = new_socket(&before, &after, &[]).expect("the new connection's socket");
        let ino = |fd: RawFd| std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
        assert_eq!(ino(found.as_raw_fd()), ino(new.as_raw_fd()), "the socket found is the new connection's");
        if new.as_raw_fd() == number {
            assert!(after.iter().any(|(fd, _)| *fd == number) && before.iter().any(|(fd, _)| *fd == number));
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
