//! Talking to a target that wants TLS (`--tls`, `--tls-ca`) or a login
//! (`--auth user:password`, memcached's `-Y` and mwproxy's `--auth-file`):
//! a connection is set up blocking — TCP, the TLS handshake, the login, the
//! mq client name — before the load uses it without blocking. TLS is rustls
//! (`mwserve::tls`), as in the middlewares.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use mwserve::tls::Session;
use rustls::pki_types::ServerName;

/// How connections are secured.
#[derive(Clone, Default)]
pub struct Secure {
    /// TLS: the client configuration and the name the targets' certificates
    /// must carry (`None`: each target's IP address).
    pub tls: Option<(Arc<rustls::ClientConfig>, Option<ServerName<'static>>)>,
    /// The login sent first on every connection (memcached text-protocol
    /// authentication).
    pub login: Option<Vec<u8>>,
}

impl std::fmt::Debug for Secure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The login holds a password: never shown.
        f.debug_struct("Secure").field("tls", &self.tls.is_some()).field("login", &self.login.is_some()).finish()
    }
}

impl Secure {
    /// From the flags: `--tls` with `--tls-ca FILE` (and `--tls-server-name`),
    /// `--auth user:password`.
    pub fn from_flags(tls: bool, ca: Option<&Path>, name: Option<&str>, auth: Option<&str>) -> Result<Secure> {
        let tls = match (tls, ca) {
            (true, Some(ca)) => {
                let cfg = mwserve::tls::client_config(ca).map_err(anyhow::Error::msg)?;
                let name = name.map(mwserve::tls::server_name).transpose().map_err(anyhow::Error::msg)?;
                Some((cfg, name))
            }
            (true, None) => bail!("--tls needs --tls-ca FILE: the CA certificates that signed the target's"),
            (false, Some(_)) => bail!("--tls-ca is only used with --tls"),
            (false, None) => None,
        };
        let login = match auth {
            Some(a) => {
                let (user, password) =
                    a.split_once(':').context("--auth takes user:password (the lines of an auth file)")?;
                if user.is_empty() || user.contains(' ') || password.contains(' ') {
                    bail!("--auth takes user:password, neither empty nor with spaces");
                }
                Some(mcproto::auth::login(user.as_bytes(), password.as_bytes()))
            }
            None => None,
        };
        Ok(Secure { tls, login })
    }
}

/// A connection being set up, blocking, with its TLS session if it has one.
pub struct Setup {
    /// The socket.
    pub stream: TcpStream,
    /// Its TLS session.
    pub session: Option<Session>,
}

impl Setup {
    /// Connects to `addr`, completes the TLS handshake and logs in, each
    /// within `timeout`.
    pub fn open(addr: SocketAddr, timeout: Duration, secure: &Secure) -> Result<Setup> {
        let stream = TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("cannot connect to {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout.max(Duration::from_secs(1))))?;
        stream.set_write_timeout(Some(timeout.max(Duration::from_secs(1))))?;
        let mut setup = Setup { stream, session: None };
        if let Some((cfg, name)) = &secure.tls {
            let name = name.clone().unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
            let mut session = Session::connect(cfg, name)?;
            session.handshake(&setup.stream).with_context(|| format!("TLS handshake with {addr} failed"))?;
            setup.session = Some(session);
        }
        if let Some(login) = &secure.login {
            let reply = setup.call_line(login).with_context(|| format!("login to {addr}"))?;
            if reply != b"STORED\r\n" {
                bail!("{addr} refused the login: {}", String::from_utf8_lossy(&reply).trim_end());
            }
        }
        Ok(setup)
    }

    /// Sends `request` and reads one reply line.
    pub fn call_line(&mut self, request: &[u8]) -> Result<Vec<u8>> {
        self.write_all(request)?;
        self.flush()?;
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n") && got.len() < 1024 {
            if self.read(&mut byte)? == 0 {
                bail!(
                    "{} closed the connection",
                    self.stream.peer_addr().map_or("the target".into(), |a| a.to_string())
                );
            }
            got.push(byte[0]);
        }
        Ok(got)
    }
}

impl Read for Setup {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.session {
            Some(s) => s.read(&self.stream, buf),
            None => self.stream.read(buf),
        }
    }
}

impl Write for Setup {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.session {
            Some(s) => s.write(&self.stream, buf),
            None => self.stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.session {
            Some(s) => {
                while !s.flush(&self.stream)? {}
                Ok(())
            }
            None => self.stream.flush(),
        }
    }
}
