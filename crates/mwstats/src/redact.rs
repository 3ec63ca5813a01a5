//! Secrets kept out of what a run leaves behind: passwords in connection
//! strings (`password=...` of libpq's key=value form, `user:secret@` of a
//! URL), wherever they appear in a command line or a configuration, become
//! `***` before anything is printed, logged or written to results.

/// What a secret is replaced with.
pub const MASK: &str = "***";

/// `text` with every `password=VALUE` (quoted or not, any case, spaces
/// around `=` allowed) and every URL's `user:secret@` password masked.
pub fn redact(text: &str) -> String {
    redact_urls(&redact_keys(text))
}

/// Flags whose value is a password (`--auth user:password` keeps the user).
const SECRET_FLAGS: &[&str] = &["--auth", "--password", "--pass"];

/// A command line with its secrets masked: [`redact`] on every argument,
/// and the values of `--auth`, `--password` and `--pass`.
pub fn redact_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mask = |flag: &str, value: &str| match (flag, value.split_once(':')) {
        ("--auth", Some((user, _))) => format!("{user}:{MASK}"),
        _ => MASK.to_string(),
    };
    for a in args {
        let after_flag = out.last().and_then(|prev| SECRET_FLAGS.iter().find(|f| **f == prev.as_str()));
        let shown = match (after_flag, a.split_once('=')) {
            (Some(flag), _) => mask(flag, &a),
            (None, Some((flag, value))) if SECRET_FLAGS.contains(&flag) => format!("{flag}={}", mask(flag, value)),
            _ => redact(&a),
        };
        out.push(shown);
    }
    out
}

fn redact_keys(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while let Some(found) = lower[i..].find("password") {
        let key_end = i + found + "password".len();
        let mut j = key_end;
        let bytes = text.as_bytes();
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        if j >= bytes.len() || bytes[j] != b'=' {
            out.push_str(&text[i..key_end]);
            i = key_end;
            continue;
        }
        j += 1;
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        out.push_str(&text[i..j]);
        // The value: quoted with ' (backslash escapes), else up to a space, & or end.
        let mut k = j;
        if k < bytes.len() && bytes[k] == b'\'' {
            k += 1;
            while k < bytes.len() && bytes[k] != b'\'' {
                k += if bytes[k] == b'\\' { 2 } else { 1 };
            }
            k = (k + 1).min(bytes.len());
        } else {
            while k < bytes.len() && !matches!(bytes[k], b' ' | b'&' | b'\t' | b'\n') {
                k += 1;
            }
        }
        if k > j {
            out.push_str(MASK);
        }
        i = k;
    }
    out.push_str(&text[i..]);
    out
}

fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(p) = rest.find("://") {
        let start = p + 3;
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let authority_end = tail.find(['/', '?', '#', ' ']).unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(&userinfo[..=colon]);
                        out.push_str(MASK);
                        out.push_str(&authority[at..]);
                    }
                    None => out.push_str(authority),
                }
            }
            None => out.push_str(authority),
        }
        rest = &tail[authority_end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_and_nothing_else() {
        assert_eq!(redact("host=/tmp port=5 password=s3cret user=x"), "host=/tmp port=5 password=*** user=x");
        assert_eq!(redact("password = 'a b\\' c' dbname=q"), "password = *** dbname=q");
        assert_eq!(redact("PASSWORD=x"), "PASSWORD=***");
        assert_eq!(
            redact("postgres://app:pw@db:5432/mq?sslmode=require"),
            "postgres://app:***@db:5432/mq?sslmode=require"
        );
        assert_eq!(redact("postgresql://app@db/mq"), "postgresql://app@db/mq");
        assert_eq!(redact("postgres://db/mq?password=pw&user=u"), "postgres://db/mq?password=***&user=u");
        assert_eq!(redact("--db"), "--db");
        assert_eq!(redact("my_password_file=/etc/x"), "my_password_file=/etc/x");
        assert_eq!(redact("password="), "password=");
        let args = ["mwload", "--auth", "loader:s3cret", "--pass=x", "--db", "host=h password=p", "-n", "3"];
        assert_eq!(
            redact_args(args.iter().map(|s| s.to_string())),
            ["mwload", "--auth", "loader:***", "--pass=***", "--db", "host=h password=***", "-n", "3"]
        );
    }
}
