//! The statements every connection prepares when it opens: their SQL is
//! `crates/mwmq/sql/statements.sql` (what each is for is written there),
//! read once, its fragments put in.

use std::collections::HashMap;
use std::sync::OnceLock;

use postgres::Statement;

/// The statements' SQL.
const SQL: &str = include_str!("../../sql/statements.sql");

/// The statements of `statements.sql` by name, with their fragments put in.
pub(super) struct Texts(HashMap<String, String>);

impl Texts {
    /// The file, read.
    pub(super) fn get_all() -> &'static Texts {
        static TEXTS: OnceLock<Texts> = OnceLock::new();
        TEXTS.get_or_init(|| Texts::parse(SQL).unwrap_or_else(|e| panic!("sql/statements.sql: {e}")))
    }

    /// Statement `name`'s SQL.
    pub(super) fn get(&self, name: &str) -> &str {
        self.0.get(name).map(String::as_str).unwrap_or_else(|| panic!("sql/statements.sql has no statement {name}"))
    }

    /// Reads blocks that begin with `-- statement: NAME` or `-- fragment:
    /// NAME` and end with a line ending in `;`; `{NAME}` of a fragment is
    /// replaced by its text (fragments may use the ones above them).
    fn parse(text: &str) -> Result<Texts, String> {
        let (mut statements, mut fragments) = (HashMap::new(), Vec::<(String, String)>::new());
        let mut open: Option<(bool, String, Vec<&str>)> = None;
        for (i, line) in text.lines().enumerate() {
            let header = line
                .strip_prefix("-- statement: ")
                .map(|n| (true, n))
                .or_else(|| line.strip_prefix("-- fragment: ").map(|n| (false, n)));
            match (&mut open, header) {
                (None, Some((statement, name))) => open = Some((statement, name.trim().to_string(), Vec::new())),
                (Some((_, name, _)), Some(_)) => return Err(format!("line {}: {name} has no ';'", i + 1)),
                (None, None) => {}
                (Some((statement, name, lines)), None) => {
                    let last = !line.trim_start().starts_with("--") && line.trim_end().ends_with(';');
                    lines.push(if last { line.trim_end().trim_end_matches(';') } else { line });
                    if last {
                        let mut sql = lines.join("\n");
                        for (f, t) in &fragments {
                            sql = sql.replace(&format!("{{{f}}}"), t);
                        }
                        if *statement {
                            statements.insert(name.clone(), sql);
                        } else {
                            fragments.push((name.clone(), sql));
                        }
                        open = None;
                    }
                }
            }
        }
        match open {
            Some((_, name, _)) => Err(format!("{name} has no ';'")),
            None => Ok(Texts(statements)),
        }
    }
}

/// Declares the statements each connection prepares: their names are the
/// names of their SQL in `statements.sql`.
macro_rules! statements {
    ($($name:ident),* $(,)?) => {
        /// The statements of one connection, prepared when it opens.
        pub(super) struct Statements {
            $(pub(super) $name: Statement,)*
        }

        /// Their names.
        #[cfg(test)]
        const NAMES: &[&str] = &[$(stringify!($name)),*];

        impl Statements {
            pub(super) async fn prepare(c: &tokio_postgres::Client) -> Result<Statements, postgres::Error> {
                let sql = Texts::get_all();
                Ok(Statements { $($name: c.prepare(sql.get(stringify!($name))).await?,)* })
            }
        }
    };
}

statements!(
    send, send_many, ack_many, send_key, key_lookup, recv, recv_plain, recv_many, pop, peek, ack, archive, dead, nack,
    touch, alter, pause, recount, settle, mark, info, quota, redrive, release, exists, create, drop, len, list,
    pending,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_has_each_statement_once_its_fragments_put_in() {
        let t = Texts::get_all();
        let mut names: Vec<&str> = t.0.keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut declared = NAMES.to_vec();
        declared.sort_unstable();
        assert_eq!(names, declared, "statements.sql and statements!() name the same statements");
        for (name, sql) in &t.0 {
            let left = sql.split('{').skip(1).find(|rest| {
                rest.split('}')
                    .next()
                    .is_some_and(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            });
            assert!(left.is_none(), "{name}: a fragment not defined above it: {{{}", left.unwrap_or(""));
            assert!(!sql.trim().is_empty() && !sql.contains(';'), "{name}: one statement, without ';'");
        }
        assert!(Texts::parse("-- statement: x\nSELECT 1").is_err(), "a statement without ';' is refused");
    }
}
