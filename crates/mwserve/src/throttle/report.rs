//! The log of failed logins: a warning with the source and the user name
//! (never the password), at most one line per source per [`LOG_EVERY`]; the
//! failures in between are counted, and the source's next line says how
//! many there were. At most [`MAX_LOGGED`] sources are followed at once;
//! past them, the failures of sources not followed share one line per
//! interval, so spraying sources cannot flood the log.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{shown_name, Attempt, Source};

/// At most one line per source this often.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// Sources followed one by one at most: in any [`LOG_EVERY`], at most this
/// many lines plus one for the rest (65 lines per 10 s, about 1 KB/s of log
/// however many addresses an attacker sprays from).
pub(super) const MAX_LOGGED: usize = 64;

/// Whose lines: one source's (or unknown sources'), or the sources past
/// [`MAX_LOGGED`] together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Who {
    Source(Option<Source>),
    Others,
}

/// A source's last line, and the failures since that were not logged.
#[derive(Debug, Clone, Copy)]
struct Line {
    at: Instant,
    unlogged: u64,
}

#[derive(Default)]
pub(super) struct Report {
    lines: Mutex<HashMap<Who, Line>>,
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Report")
    }
}

impl Report {
    /// `a` failed (`what`: how); logged unless its source had a line in the
    /// last [`LOG_EVERY`].
    pub(super) fn failed(&self, a: &Attempt, what: &dyn std::fmt::Display) {
        let now = Instant::now();
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let mut who = Who::Source(a.source);
        if lines.len() >= MAX_LOGGED && !lines.contains_key(&who) {
            lines.retain(|w, l| *w == Who::Others || now.duration_since(l.at) < LOG_EVERY);
            if lines.len() >= MAX_LOGGED {
                who = Who::Others;
            }
        }
        let before = match lines.get_mut(&who) {
            Some(l) if now.duration_since(l.at) < LOG_EVERY => {
                l.unlogged += 1;
                return;
            }
            Some(l) => l.unlogged,
            None => 0,
        };
        lines.insert(who, Line { at: now, unlogged: 0 });
        drop(lines);
        let text = describe(a, what);
        match (who, before) {
            (Who::Others, 0) => tracing::warn!("{text} (one line per {LOG_EVERY:?} for sources past {MAX_LOGGED})"),
            (Who::Others, n) => tracing::warn!("{text} (and {n} more failed logins from sources past {MAX_LOGGED})"),
            (_, 0) => tracing::warn!("{text}"),
            (_, n) => tracing::warn!("{text} (and {n} more failed logins from there since its last line)"),
        }
    }
}

/// `failed login over AUTH from 10.0.0.7 as user "alice": wrong password`.
fn describe(a: &Attempt, what: &dyn std::fmt::Display) -> String {
    let from = a.source.map_or_else(|| "an unknown source".to_string(), |s| s.to_string());
    match a.user {
        Some(u) => format!("failed login over {} from {from} as user \"{}\": {what}", a.via, shown_name(u)),
        None => format!("failed login over {} from {from}: {what}", a.via),
    }
}
