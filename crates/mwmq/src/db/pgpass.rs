//! The database password where libpq would find it when the connection
//! string has none: `PGPASSWORD`, then the password file — `passfile=` in
//! the connection string, else `PGPASSFILE`, else `~/.pgpass` — whose lines
//! are `host:port:database:user:password` (`*` matches anything, `\:` and
//! `\\` escape). As libpq does, a password file that its group or others may
//! read is ignored, with a warning; a Unix-socket connection matches the host
//! `localhost` or the socket directory.

use std::path::{Path, PathBuf};

use tokio_postgres::config::Host;

/// The password for the connection `pg` describes, or `None`.
pub fn password_for(pg: &tokio_postgres::Config, passfile: Option<&str>) -> Option<String> {
    if let Ok(p) = std::env::var("PGPASSWORD") {
        if !p.is_empty() {
            return Some(p);
        }
    }
    let path = match passfile {
        Some(p) => PathBuf::from(p),
        None => match std::env::var_os("PGPASSFILE") {
            Some(p) => PathBuf::from(p),
            None => PathBuf::from(std::env::var_os("HOME")?).join(".pgpass"),
        },
    };
    lookup(&path, pg)
}

fn lookup(path: &Path, pg: &tokio_postgres::Config) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).ok()?;
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(
            "password file {} has group or world access and is ignored (as libpq does); chmod 600 it",
            path.display()
        );
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let hosts: Vec<String> = match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => vec![h.clone()],
        Some(Host::Unix(dir)) => vec!["localhost".into(), dir.display().to_string()],
        None => vec!["localhost".into()],
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432).to_string();
    let user = pg.get_user().unwrap_or_default();
    let db = pg.get_dbname().unwrap_or(user);
    text.lines().filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty()).find_map(|line| {
        let f = fields(line);
        if f.len() != 5 {
            return None;
        }
        let matches = |pattern: &str, value: &str| pattern == "*" || pattern == value;
        let host_ok = f[0] == "*" || hosts.iter().any(|h| *h == f[0]);
        (host_ok && matches(&f[1], &port) && matches(&f[2], db) && matches(&f[3], user)).then(|| f[4].clone())
    })
}

/// The `:`-separated fields of a password-file line, with `\` escapes undone.
fn fields(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.last_mut().expect("one field at least").extend(chars.next()),
            ':' if out.len() < 5 => out.push(String::new()),
            c => out.last_mut().expect("one field at least").push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_password_file_is_read_as_libpq_reads_it() {
        let dir = std::env::temp_dir().join(format!("mwmq-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pgpass");
        std::fs::write(
            &file,
            "# comment\nother:5432:*:app:no\ndb.example:5432:mq:app:pa\\:ss\n*:*:*:app:fallback\n/tmp/pg:*:*:*:socket\n",
        )
        .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let cfg = |s: &str| s.parse::<tokio_postgres::Config>().unwrap();
        let f = file.to_str();
        assert_eq!(password_for(&cfg("host=db.example user=app dbname=mq"), f).as_deref(), Some("pa:ss"));
        assert_eq!(password_for(&cfg("host=db.example user=app dbname=other"), f).as_deref(), Some("fallback"));
        assert_eq!(password_for(&cfg("host=/tmp/pg user=bob dbname=x"), f).as_deref(), Some("socket"));
        assert_eq!(password_for(&cfg("host=db.example user=bob dbname=mq"), f), None);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(password_for(&cfg("host=db.example user=app dbname=mq"), f), None, "readable by others: ignored");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
