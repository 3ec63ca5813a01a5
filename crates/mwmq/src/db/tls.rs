//! TLS to PostgreSQL as libpq understands the connection string: `sslmode`
//! (`disable`, `prefer`, `require`, `verify-ca`, `verify-full`) and
//! `sslrootcert`. The client library (`tokio-postgres`) knows only the first
//! three modes and no root certificate, so both are read here, the string it
//! gets is the rest, and the checking the mode asks for is rustls's
//! (`tokio-postgres-rustls`):
//!
//! - `disable`: no TLS; `prefer` (the default) and `require`: TLS when the
//!   server offers it (required with `require`), the certificate not
//!   checked — libpq's meaning, encryption against eavesdropping only;
//! - `verify-ca` (also `require` with an `sslrootcert`, as libpq does): the
//!   certificate must come from the CA in `sslrootcert`;
//! - `verify-full`: that, and it must name the host connected to.
//!
//! Unix-socket connections never use TLS, whatever the mode.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// What `sslmode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No TLS.
    Disable,
    /// TLS if offered, not checked.
    Prefer,
    /// TLS, not checked (checked against `sslrootcert` when one is given).
    Require,
    /// TLS from the CA in `sslrootcert`.
    VerifyCa,
    /// TLS from that CA, naming the host.
    VerifyFull,
}

/// A connection string taken apart: what the client library reads, and the TLS settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbTarget {
    /// The connection string without `sslmode=verify-*` and `sslrootcert`.
    pub conninfo: String,
    /// The mode asked for.
    pub mode: Mode,
    /// `sslrootcert`.
    pub root: Option<String>,
    /// `passfile`: where to look for the password (`pgpass.rs`).
    pub passfile: Option<String>,
}

fn mode_of(v: &str) -> Result<Mode, String> {
    Ok(match v {
        "disable" => Mode::Disable,
        "allow" | "prefer" => Mode::Prefer,
        "require" => Mode::Require,
        "verify-ca" => Mode::VerifyCa,
        "verify-full" => Mode::VerifyFull,
        other => return Err(format!("sslmode {other:?}: use disable, prefer, require, verify-ca or verify-full")),
    })
}

/// Reads `sslmode`, `sslrootcert` and `passfile` out of a key=value string or a URL.
pub fn split(url: &str) -> Result<DbTarget, String> {
    let mut mode = None;
    let mut root = None;
    let mut passfile = None;
    let conninfo = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("sslmode", v)) => mode = Some(mode_of(v)?),
                Some(("sslrootcert", v)) => root = Some(v.to_string()),
                Some(("passfile", v)) => passfile = Some(v.to_string()),
                _ => kept.push(pair),
            }
        }
        if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        }
    } else {
        let mut kept = Vec::new();
        for (k, v) in key_values(url)? {
            match k.as_str() {
                "sslmode" => mode = Some(mode_of(&v)?),
                "sslrootcert" => root = Some(v),
                "passfile" => passfile = Some(v),
                _ => kept.push(format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))),
            }
        }
        kept.join(" ")
    };
    let mode = match (mode.unwrap_or(Mode::Prefer), &root) {
        (Mode::Require, Some(_)) => Mode::VerifyCa,
        (m @ (Mode::VerifyCa | Mode::VerifyFull), None) => {
            return Err(format!("sslmode {m:?} needs sslrootcert=FILE, the CA that signed the server's certificate"))
        }
        (m, _) => m,
    };
    let lib_mode = match mode {
        Mode::Disable => "disable",
        Mode::Prefer => "prefer",
        _ => "require",
    };
    let conninfo = if conninfo.contains("://") {
        let sep = if conninfo.contains('?') { '&' } else { '?' };
        format!("{conninfo}{sep}sslmode={lib_mode}")
    } else {
        format!("{conninfo} sslmode={lib_mode}").trim().to_string()
    };
    Ok(DbTarget { conninfo, mode, root, passfile })
}

/// `key=value` pairs of a libpq string (values may be quoted with `'`).
fn key_values(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(out);
        }
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=' && !c.is_whitespace())).collect();
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(format!("connection string: {key:?} has no value"));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => return Err(format!("connection string: the value of {key} is not closed")),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| !c.is_whitespace())).collect();
        }
        out.push((key, value));
    }
}

/// The checking libpq does below `verify-full`: none (`prefer`, `require`
/// without a root certificate: encryption only), or the chain against the CA
/// but not the name (`verify-ca`). Handshake signatures are always checked.
#[derive(Debug)]
struct Lenient {
    /// The CA's verifier (`verify-ca`); `None`: any certificate.
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end: &CertificateDer<'_>,
        middle: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match chain.verify_server_cert(end, middle, name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.provider.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.provider.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// The connector for `t`'s mode.
pub fn connector(t: &DbTarget) -> Result<MakeRustlsConnect, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let config = match (&t.root, t.mode) {
        (Some(root), Mode::VerifyCa | Mode::VerifyFull) => {
            let mut roots = rustls::RootCertStore::empty();
            let pem = |e: &dyn std::fmt::Display| format!("sslrootcert {root}: {e}");
            for c in rustls::pki_types::pem::PemObject::pem_file_iter(Path::new(root)).map_err(|e| pem(&e))? {
                roots.add(c.map_err(|e| pem(&e))?).map_err(|e| pem(&e))?;
            }
            let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| pem(&e))?;
            if t.mode == Mode::VerifyFull {
                builder.with_webpki_verifier(verifier).with_no_client_auth()
            } else {
                let lenient = Lenient { chain: Some(verifier), provider };
                builder.dangerous().with_custom_certificate_verifier(Arc::new(lenient)).with_no_client_auth()
            }
        }
        _ => {
            let lenient = Lenient { chain: None, provider };
            builder.dangerous().with_custom_certificate_verifier(Arc::new(lenient)).with_no_client_auth()
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_lose_what_the_library_cannot_read() {
        let t = split("host=db.example port=5432 dbname=mwmq sslmode=verify-full sslrootcert=/etc/ca.pem").unwrap();
        assert_eq!(t.mode, Mode::VerifyFull);
        assert_eq!(t.root.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(t.conninfo, "host='db.example' port='5432' dbname='mwmq' sslmode=require");
        assert!(t.conninfo.parse::<postgres::Config>().is_ok());
        let u = split("postgresql://u@db/mwmq?sslmode=verify-ca&sslrootcert=/ca.pem&application_name=x").unwrap();
        assert_eq!(
            (u.mode, u.conninfo.as_str()),
            (Mode::VerifyCa, "postgresql://u@db/mwmq?application_name=x&sslmode=require")
        );
        assert_eq!(split("host=/tmp").unwrap().mode, Mode::Prefer);
        assert_eq!(split("host=h sslmode=require sslrootcert=c.pem").unwrap().mode, Mode::VerifyCa, "as libpq");
        assert!(split("host=h sslmode=verify-full").unwrap_err().contains("sslrootcert"));
        assert!(split("host=h sslmode=sometimes").unwrap_err().contains("sslmode"));
        assert!(split("password='it''s' host=x").unwrap_err().contains("has no value"));
        assert_eq!(split("password='a b\\'c' host=x").unwrap().conninfo, "password='a b\\'c' host='x' sslmode=prefer");
    }
}
