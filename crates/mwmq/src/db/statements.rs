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

    /// The statements of periodic jobs (`sql/schedules.sql`, in this
    /// file's form; run unprepared: `db/schedules.rs`).
    pub(super) fn schedules() -> &'static Texts {
        static TEXTS: OnceLock<Texts> = OnceLock::new();
        TEXTS.get_or_init(|| {
            Texts::parse(include_str!("../../sql/schedules.sql")).unwrap_or_else(|e| panic!("sql/schedules.sql: {e}"))
        })
    }

    /// Statement `name`'s SQL.
    pub(super) fn get(&self, name: &str) -> &str {
        self.0.get(name).map(String::as_str).unwrap_or_else(|| panic!("sql/statements.sql has no statement {name}"))
    }

    /// Reads blocks that begin with `-- statement: NAME` or `-- fragment:
    /// NAME` and end with a line ending in `;`; `{NAME}` of a fragment is
    /// replaced by its text (fragments may use the ones above them). Outside
    /// the blocks only comments and blank lines may stand (so a `;` that
    /// ends a block too early leaves a line that is refused), a name may be
    /// given once, and a `{NAME}` no fragment above defines is refused.
    fn parse(text: &str) -> Result<Texts, String> {
        let (mut statements, mut fragments) = (HashMap::new(), Vec::<(String, String)>::new());
        let mut open: Option<(bool, String, Vec<&str>)> = None;
        for (i, line) in text.lines().enumerate() {
            let at = |what: String| Err(format!("line {}: {what}", i + 1));
            let header = line
                .strip_prefix("-- statement: ")
                .map(|n| (true, n))
                .or_else(|| line.strip_prefix("-- fragment: ").map(|n| (false, n)));
            match (&mut open, header) {
                (None, Some((statement, name))) => open = Some((statement, name.trim().to_string(), Vec::new())),
                (Some((_, name, _)), Some(_)) => return at(format!("{name} has no ';'")),
                (None, None) if line.trim().is_empty() || line.trim_start().starts_with("--") => {}
                (None, None) => return at(format!("text outside a statement: {line}")),
                (Some((statement, name, lines)), None) => {
                    let last = !line.trim_start().starts_with("--") && line.trim_end().ends_with(';');
                    lines.push(if last { line.trim_end().trim_end_matches(';') } else { line });
                    if !last {
                        continue;
                    }
                    let mut sql = lines.join("\n");
                    for (f, t) in &fragments {
                        sql = sql.replace(&format!("{{{f}}}"), t);
                    }
                    if let Some(unknown) = placeholder(&sql) {
                        return at(format!("{name} uses {{{unknown}}}, which no fragment above defines"));
                    }
                    let taken = statements.contains_key(name.as_str()) || fragments.iter().any(|(f, _)| f == name);
                    if taken {
                        return at(format!("{name} is given twice"));
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
        match open {
            Some((_, name, _)) => Err(format!("{name} has no ';'")),
            None => Ok(Texts(statements)),
        }
    }
}

/// Every statement each connection prepares, by name, with its SQL as it
/// is sent (fragments put in), sorted by name: for tests and tools that
/// look at their plans (`tests/delivery/plans.rs`).
pub fn all() -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<(&str, &str)> = Texts::get_all().0.iter().map(|(n, s)| (n.as_str(), s.as_str())).collect();
    v.sort_unstable();
    v
}

/// The first `{NAME}` left in `sql` (a name of letters, digits and `_`).
fn placeholder(sql: &str) -> Option<&str> {
    sql.split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(w, _)| w))
        .find(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
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
    send,
    prioritize,
    send_many,
    ack_many,
    send_key,
    key_lookup,
    recv,
    recv_plain,
    recv_many,
    pop,
    peek,
    recv_plain_ranked,
    recv_many_ranked,
    pop_ranked,
    peek_ranked,
    ack,
    archive,
    dead,
    nack,
    touch,
    alter,
    pause,
    recount,
    settle,
    mark,
    info,
    quota,
    redrive,
    release,
    exists,
    create,
    drop,
    len,
    list,
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
            assert!(!sql.trim().is_empty() && !sql.contains(';'), "{name}: one statement, without ';'");
        }
        let schedules = Texts::schedules();
        let mut names: Vec<&str> = schedules.0.keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut used = super::super::schedules::STATEMENTS.to_vec();
        used.sort_unstable();
        assert_eq!(names, used, "schedules.sql and db/schedules.rs name the same statements");
        let refused = |text: &str| Texts::parse(text).err().unwrap_or_else(|| panic!("accepted: {text}"));
        assert!(refused("-- statement: x\nSELECT 1").contains("no ';'"));
        assert!(refused("-- statement: x\nUPDATE t SET a = 1 -- a;\nWHERE b;").contains("outside a statement"));
        assert!(refused("-- statement: x\nSELECT 1;\n-- statement: x\nSELECT 2;").contains("twice"));
        assert!(refused("-- statement: x\nSELECT {LATER};\n-- fragment: LATER\n1;").contains("{LATER}"));
        let t = Texts::parse("-- fragment: F\n1;\n-- statement: x\nSELECT {F}, '{a,b}';").unwrap();
        assert_eq!(t.get("x"), "SELECT 1, '{a,b}'");
    }
}
