//! Authentication as memcached does it (`memcached -Y FILE`): a file of
//! `user:password` lines for the clients (`--auth-file`), checked by the net
//! threads before a connection's first request (the exchange itself is
//! `mcproto::auth`), and the login mwproxy sends to servers that require it
//! (`--server-auth-file`, first line). Passwords are never logged.

use std::path::Path;

/// A user and a password.
type Entry = (Vec<u8>, Vec<u8>);

/// The users a proxy lets in.
pub struct Users {
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Users({} entries)", self.entries.len())
    }
}

/// The largest users file read (memcached keeps a handful of entries).
const MAX_FILE: u64 = 1 << 20;

fn entries(path: &Path, allow_readable: bool) -> Result<Vec<Entry>, String> {
    let what = |e: &dyn std::fmt::Display| format!("auth file {}: {e}", path.display());
    if !allow_readable {
        mwserve::config::check_private(path, "auth file", "--allow-readable-secrets")?;
    }
    let size = std::fs::metadata(path).map_err(|e| what(&e))?.len();
    if size > MAX_FILE {
        return Err(what(&format!("larger than {MAX_FILE} bytes")));
    }
    let text = std::fs::read(path).map_err(|e| what(&e))?;
    let mut out = Vec::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| what(&format!("line {} is not user:password", i + 1)))?;
        let (user, password) = (&line[..colon], &line[colon + 1..]);
        if user.is_empty() || password.is_empty() || user.contains(&b' ') || password.contains(&b' ') {
            return Err(what(&format!("line {}: user and password must be non-empty words", i + 1)));
        }
        out.push((user.to_vec(), password.to_vec()));
    }
    if out.is_empty() {
        return Err(what(&"no user:password line"));
    }
    Ok(out)
}

impl Users {
    /// The users of a file of `user:password` lines (memcached's `-Y` format).
    /// A file others may read is refused unless `allow_readable`.
    pub fn load(path: &Path, allow_readable: bool) -> Result<Users, String> {
        entries(path, allow_readable).map(|entries| Users { entries })
    }

    /// Whether `user` may log in with `password` (compared in constant time).
    pub fn check(&self, user: &[u8], password: &[u8]) -> bool {
        let mut ok = false;
        for (u, p) in &self.entries {
            ok |= same(u, user) & same(p, password);
        }
        ok
    }
}

/// Whether two byte strings are equal, in time that depends only on their lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The login for servers that require authentication: the first line of a
/// `user:password` file, as `mcproto::auth::login` bytes.
pub fn server_login(path: &Path, allow_readable: bool) -> Result<Vec<u8>, String> {
    let (user, password) = entries(path, allow_readable)?.swap_remove(0);
    Ok(mcproto::auth::login(&user, &password))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_file_as_memcached_reads_it() {
        let dir = std::env::temp_dir().join(format!("mwproxy-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("users");
        std::fs::write(&path, "alice:secret\r\nbob:p:w\n\n").unwrap();
        let readable = Users::load(&path, false).unwrap_err();
        assert!(readable.contains("every user of this machine may read it") && readable.contains("chmod 600"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let users = Users::load(&path, false).unwrap();
        assert!(users.check(b"alice", b"secret") && users.check(b"bob", b"p:w"));
        assert!(
            !users.check(b"alice", b"secre") && !users.check(b"alice", b"secrex") && !users.check(b"eve", b"secret")
        );
        assert_eq!(server_login(&path, false).unwrap(), b"set auth 0 0 12\r\nalice secret\r\n");
        std::fs::write(&path, "alice\n").unwrap();
        assert!(Users::load(&path, true).unwrap_err().contains("line 1 is not user:password"));
        std::fs::write(&path, "\n").unwrap();
        assert!(Users::load(&path, true).unwrap_err().contains("no user:password"));
        assert!(Users::load(&dir.join("missing"), true).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
