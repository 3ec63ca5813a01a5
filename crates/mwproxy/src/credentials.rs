//! What the proxy reads from files to speak securely, loaded at start (and
//! again by a reload): the users clients log in as (`--auth-file`), the login
//! it sends to servers (`--server-auth-file`), the TLS listener's certificate
//! (`--tls-cert`, `--tls-key`, `--tls-ca`) and the CA and names it checks the
//! servers' certificates against (`--server-tls`). A file that cannot be read
//! refuses the configuration, with the file's name and why.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::ServerName;

use crate::auth::{server_login, Users};
use crate::config::{Config, ConfigError};
use crate::exchange::Endpoint;

/// Everything secure the proxy needs, ready to use.
#[derive(Default)]
pub struct Credentials {
    /// Who may log in; everyone when `None`.
    pub users: Option<Users>,
    /// The login sent to servers that require one.
    pub login: Option<Vec<u8>>,
    /// The TLS listener's configuration.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// TLS to the servers: the client configuration and each server's name.
    pub server_tls: Option<(Arc<rustls::ClientConfig>, Vec<ServerName<'static>>)>,
}

impl Credentials {
    /// Reads every file `config` names.
    pub fn load(config: &Config) -> Result<Credentials, ConfigError> {
        let path = |p: &String| Path::new(p).to_path_buf();
        let open = config.auth.allow_readable_secrets;
        let users = config.auth.file.as_ref().map(|f| Users::load(&path(f), open)).transpose().map_err(ConfigError)?;
        let login =
            config.backend.auth_file.as_ref().map(|f| server_login(&path(f), open)).transpose().map_err(ConfigError)?;
        let tls = config.tls.server_config()?;
        let b = &config.backend;
        let server_tls = match (&b.tls, &b.tls_ca) {
            (true, Some(ca)) => {
                let cfg = mwserve::tls::client_config(&path(ca)).map_err(ConfigError)?;
                let names = config
                    .effective_routing()
                    .servers
                    .iter()
                    .map(|s| mwserve::tls::server_name(b.tls_server_name.as_deref().unwrap_or(&s.host)))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(ConfigError)?;
                Some((cfg, names))
            }
            _ => None,
        };
        Ok(Credentials { users, login, tls, server_tls })
    }
}

impl Credentials {
    /// The endpoints of servers at `addrs` (configuration order), with the
    /// names their certificates must carry when they are spoken to with TLS.
    pub fn endpoints(&self, addrs: &[mwserve::stream::Addr]) -> Vec<Endpoint> {
        let names = self.server_tls.as_ref().map(|(_, names)| names);
        addrs
            .iter()
            .enumerate()
            .map(|(i, addr)| Endpoint { addr: addr.clone(), tls_name: names.map(|n| n[i].clone()) })
            .collect()
    }
}
