//! TLS with rustls (the `ring` provider; no OpenSSL), the same for every
//! middleware and for both sides of one: loading certificates and keys into
//! configurations, and a [`Session`] that carries a rustls connection over a
//! socket — non-blocking (event loops) or blocking with timeouts (pool
//! workers) alike: a wait that ends without bytes is `WouldBlock` or
//! `TimedOut`, as the socket says, and nothing is lost by trying again.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};

/// rustls with the `ring` provider.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

fn roots(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for c in certs(path)? {
        roots.add(c).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(roots)
}

/// The configuration of a TLS listener: its certificate chain and key, and,
/// with `client_ca`, the CA that must have signed every client's certificate.
pub fn server_config(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Arc<ServerConfig>, String> {
    let chain = certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    builder.with_single_cert(chain, key).map(Arc::new).map_err(|e| format!("{}: {e}", cert.display()))
}

/// The configuration of a TLS client that trusts the certificates `ca` signed.
pub fn client_config(ca: &Path) -> Result<Arc<ClientConfig>, String> {
    let roots = roots(ca)?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(builder.with_root_certificates(roots).with_no_client_auth()))
}

/// The name a server's certificate must carry: a DNS name or an IP address.
pub fn server_name(name: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(name.to_string()).map_err(|e| format!("{name:?} is not a server name: {e}"))
}

/// Whether an I/O error only says that nothing came (or went) in time.
pub fn quiet(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// One TLS connection's state, carried over a socket the caller owns, and
/// about how many bytes of it wait in the session for the socket (plaintext
/// taken, less records written; see [`Session::held`]).
pub struct Session(rustls::Connection, usize);

impl Session {
    /// The server's side of a connection a TLS listener accepted.
    pub fn accept(cfg: &Arc<ServerConfig>) -> io::Result<Session> {
        ServerConnection::new(cfg.clone()).map(|c| Session(c.into(), 0)).map_err(io::Error::other)
    }

    /// The client's side of a connection to `name`.
    pub fn connect(cfg: &Arc<ClientConfig>, name: ServerName<'static>) -> io::Result<Session> {
        ClientConnection::new(cfg.clone(), name).map(|c| Session(c.into(), 0)).map_err(io::Error::other)
    }

    /// Completes the handshake over a blocking socket (with its timeouts).
    pub fn handshake(&mut self, mut sock: impl Read + Write) -> io::Result<()> {
        while self.0.is_handshaking() {
            self.0.complete_io(&mut sock).map_err(|e| match e.kind() {
                io::ErrorKind::InvalidData => io::Error::new(io::ErrorKind::InvalidData, format!("tls: {e}")),
                _ => e,
            })?;
        }
        Ok(())
    }

    /// Whether the handshake is still going on.
    pub fn handshaking(&self) -> bool {
        self.0.is_handshaking()
    }

    /// Reads plaintext: what the session holds, else what the socket brings.
    /// `Ok(0)` is the end of the stream; a TLS error (a failed handshake,
    /// plaintext sent to a TLS port) is `InvalidData`, after the alert has
    /// been sent.
    pub fn read(&mut self, mut sock: impl Read + Write, out: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.0.reader().read(out) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            if self.0.read_tls(&mut sock)? == 0 {
                return Ok(0);
            }
            if let Err(e) = self.0.process_new_packets() {
                let _ = self.0.write_tls(&mut sock);
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("tls: {e}")));
            }
            // Handshake messages, key updates: answer them now.
            match self.flush(&mut sock) {
                Err(e) if !quiet(&e) => return Err(e),
                _ => {}
            }
        }
    }

    /// Takes as much plaintext as the session buffers (64 KiB) and writes
    /// what the socket takes; `WouldBlock` only when the socket said so.
    ///
    /// A session whose buffer was full takes nothing; if the socket then
    /// takes every record the session held, there is room again and the
    /// plaintext is offered once more. Answering `WouldBlock` there instead
    /// (as this once did) stalled large replies: the caller waits for the
    /// socket to become writable, but a socket that never filled up raises no
    /// such event, so the rest of the reply waited for the client's next
    /// request.
    pub fn write(&mut self, mut sock: impl Read + Write, buf: &[u8]) -> io::Result<usize> {
        loop {
            let n = self.0.writer().write(buf)?;
            self.1 += n;
            let drained = match self.flush(&mut sock) {
                Ok(drained) => drained,
                Err(e) if quiet(&e) => false,
                Err(e) => return Err(e),
            };
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            if !drained || self.0.is_handshaking() {
                // The socket is full (it will say when it takes more), or the
                // handshake holds the plaintext back (it is written when the
                // handshake ends, on the read path).
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }

    /// Writes the records the session holds; true when none is left.
    pub fn flush(&mut self, mut sock: impl Read + Write) -> io::Result<bool> {
        while self.0.wants_write() {
            match self.0.write_tls(&mut sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.1 = self.1.saturating_sub(n),
                Err(e) if quiet(&e) => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Whether records wait to be written.
    pub fn wants_write(&self) -> bool {
        self.0.wants_write()
    }

    /// About how many bytes of replies the session holds for the socket
    /// (at most rustls's 64 KiB buffer, plus a record's overhead): memory
    /// budgets count them as they count a plaintext connection's unwritten
    /// bytes. 0 once every record is written.
    pub fn held(&self) -> usize {
        if self.0.wants_write() {
            self.1
        } else {
            0
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// A CA and a certificate it signed for `localhost` and 127.0.0.1, as PEM files in `dir`:
    /// (ca, cert, key).
    pub(crate) fn certificates(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
        let leaf = leaf.signed_by(&key, &ca, &ca_key).unwrap();
        let paths = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&paths.0, ca.pem()).unwrap();
        std::fs::write(&paths.1, leaf.pem()).unwrap();
        std::fs::write(&paths.2, key.serialize_pem()).unwrap();
        paths
    }

    #[test]
    fn a_client_and_a_server_session_talk_over_blocking_sockets() {
        let dir = std::env::temp_dir().join(format!("mwserve-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, cert, key) = certificates(&dir);
        let server_cfg = server_config(&cert, &key, None).unwrap();
        let client_cfg = client_config(&ca).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            let mut s = Session::accept(&server_cfg).unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut sock, &mut buf).unwrap();
            s.write(&mut sock, &buf[..n]).unwrap();
            while !s.flush(&mut sock).unwrap() {}
        });
        let mut sock = TcpStream::connect(addr).unwrap();
        let mut c = Session::connect(&client_cfg, server_name("127.0.0.1").unwrap()).unwrap();
        assert!(c.handshaking());
        c.write(&mut sock, b"hello\r\n").unwrap();
        while !c.flush(&mut sock).unwrap() {}
        let mut buf = [0u8; 64];
        let n = c.read(&mut sock, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello\r\n");
        server.join().unwrap();
        // A client that does not trust the CA fails the handshake, with a TLS error.
        assert!(server_config(&ca, &key, None).is_err(), "a key that does not match the certificate");
        assert!(client_config(&dir.join("missing.pem")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A socket that takes nothing while closed (`WouldBlock`) and everything once open.
    struct Gate {
        open: bool,
        taken: usize,
    }

    impl Read for Gate {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if !self.open {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.taken += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Moves records from `from` to `to` until neither has anything to say.
    fn pump(from: &mut rustls::Connection, to: &mut rustls::Connection) {
        let mut bytes = Vec::new();
        while from.wants_write() {
            from.write_tls(&mut bytes).unwrap();
        }
        let mut slice = &bytes[..];
        while !slice.is_empty() {
            to.read_tls(&mut slice).unwrap();
            to.process_new_packets().unwrap();
        }
    }

    /// After the socket was full, the first write once it drains must take
    /// more plaintext: it once answered `WouldBlock` although the socket had
    /// just taken every record, and a socket that never fills again raises
    /// no writable event, so the rest of a large reply waited for the
    /// client's next request.
    #[test]
    fn a_write_after_the_socket_drained_takes_more() {
        let dir = std::env::temp_dir().join(format!("mwserve-tls-gate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, cert, key) = certificates(&dir);
        let mut server = Session::accept(&server_config(&cert, &key, None).unwrap()).unwrap();
        let mut client = Session::connect(&client_config(&ca).unwrap(), server_name("127.0.0.1").unwrap()).unwrap();
        while client.0.is_handshaking() || server.0.is_handshaking() {
            pump(&mut client.0, &mut server.0);
            pump(&mut server.0, &mut client.0);
        }
        let reply = vec![b'v'; 1 << 20];
        let mut sock = Gate { open: false, taken: 0 };
        let first = server.write(&mut sock, &reply).unwrap();
        assert!(first > 0, "the session buffers some");
        let full = server.write(&mut sock, &reply[first..]).unwrap_err();
        assert_eq!(full.kind(), io::ErrorKind::WouldBlock, "the session is full and the socket too");
        assert_eq!(server.held(), first, "what the session holds is counted");
        // The socket drains: every write takes more, to the end, without a WouldBlock.
        sock.open = true;
        let mut sent = first;
        while sent < reply.len() {
            sent += server.write(&mut sock, &reply[sent..]).expect("an open socket never blocks");
        }
        assert!(server.flush(&mut sock).unwrap());
        assert!(sock.taken > reply.len(), "every byte went out, encrypted");
        assert_eq!(server.held(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
