//! What every middleware process does around its work: logging, stopping on
//! SIGTERM or SIGINT, and the command line's sizes and booleans.

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event: time, level, where, message, fields.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `message`
    /// and the event's fields at the top level), for log shippers.
    Json,
}

/// Logs to standard error with `filter` (`error`, `warn`, `info`, `debug`,
/// `trace`, or a tracing filter), else `RUST_LOG`, else `info`, in `format`.
pub fn init_logging(filter: Option<&str>, format: LogFormat) {
    let _ = init_logging_to(filter, format, None);
}

/// As [`init_logging`], to the file at `path` (appended to) when one is
/// given. Colour codes only when the text goes to a terminal and `NO_COLOR`
/// is not set: a file, a pipe or the journal gets plain text (and JSON never
/// has any).
pub fn init_logging_to(filter: Option<&str>, format: LogFormat, path: Option<&std::path::Path>) -> std::io::Result<()> {
    use std::io::IsTerminal;
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    let filter = filter.map(str::to_string).or_else(|| std::env::var("RUST_LOG").ok()).unwrap_or_else(|| "info".into());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| "info".into());
    let (writer, terminal) = match path {
        Some(p) => {
            let file = std::fs::OpenOptions::new().create(true).append(true).open(p)?;
            (BoxMakeWriter::new(std::sync::Mutex::new(file)), false)
        }
        // NO_COLOR (no-color.org) turns them off on a terminal too.
        None => {
            let plain = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
            (BoxMakeWriter::new(std::io::stderr), std::io::stderr().is_terminal() && !plain)
        }
    };
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    let _ = match format {
        LogFormat::Text => fmt.with_ansi(terminal).try_init(),
        LogFormat::Json => fmt.with_ansi(false).json().flatten_event(true).try_init(),
    };
    Ok(())
}

/// SIGTERM, SIGINT and SIGHUP, caught from the moment [`catch_signals`]
/// returns and held until [`Caught::serve`] acts on them: a server catches
/// them before it starts, so that a signal sent as soon as its port opens
/// (a reload right after a start, a stop) is acted on once it runs, where
/// the default action of SIGHUP and SIGTERM would have killed it.
pub struct Caught(signal_hook::iterator::Signals);

/// Starts catching the signals a server acts on.
pub fn catch_signals() -> std::io::Result<Caught> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    Ok(Caught(signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?))
}

impl Caught {
    /// Calls `stop` (on a thread of its own) when SIGTERM or SIGINT arrives
    /// (or arrived since they were caught), and `reload` at every SIGHUP (a
    /// program that cannot reload says so in its log and goes on).
    pub fn serve(self, stop: Box<dyn FnOnce() + Send>, reload: Option<crate::shell::Reload>) -> std::io::Result<()> {
        use signal_hook::consts::SIGHUP;
        let mut signals = self.0;
        std::thread::Builder::new().name("signals".into()).spawn(move || {
            for sig in signals.forever() {
                if sig != SIGHUP {
                    tracing::info!(signal = sig, "stopping: finishing in-flight requests");
                    stop();
                    return;
                }
                match &reload {
                    // The reload logs what it did, or why it refused.
                    Some(reload) => drop(reload()),
                    None => tracing::warn!("SIGHUP: this program does not reload its configuration; restart it"),
                }
            }
        })?;
        Ok(())
    }
}

/// A warning about something that may happen often (failed TLS handshakes,
/// refused logins): logged at most once per interval, with how many times it
/// happened since the last line, so that a flood of them cannot flood the log.
pub struct Throttled {
    what: &'static str,
    every_ms: u64,
    started: std::time::Instant,
    /// Milliseconds since `started` of the last line (u64::MAX: none yet).
    logged_ms: std::sync::atomic::AtomicU64,
    unlogged: std::sync::atomic::AtomicU64,
}

impl Throttled {
    /// Warnings about `what`, at most one per `every`.
    pub fn new(what: &'static str, every: std::time::Duration) -> Throttled {
        Throttled {
            what,
            every_ms: every.as_millis() as u64,
            started: std::time::Instant::now(),
            logged_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
            unlogged: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// It happened again (`detail` says how); true when this one was logged.
    pub fn note(&self, detail: &dyn std::fmt::Display) -> bool {
        self.note_at(detail, self.started.elapsed().as_millis() as u64)
    }

    /// [`Throttled::note`] at `now`, in milliseconds since it was made (the tests' clock).
    fn note_at(&self, detail: &dyn std::fmt::Display, now: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let n = self.unlogged.fetch_add(1, Relaxed) + 1;
        let last = self.logged_ms.load(Relaxed);
        let due = last == u64::MAX || now.saturating_sub(last) >= self.every_ms;
        if !due || self.logged_ms.compare_exchange(last, now, Relaxed, Relaxed).is_err() {
            return false;
        }
        self.unlogged.fetch_sub(n, Relaxed);
        tracing::warn!("{}: {n} since the last report; the last: {detail}", self.what);
        true
    }
}

/// A size in bytes: `1048576`, `512k` or `4m`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let lower = s.to_ascii_lowercase();
    let (digits, mult) = match lower.strip_suffix('k') {
        Some(d) => (d, 1024),
        None => match lower.strip_suffix('m') {
            Some(d) => (d, 1024 * 1024),
            None => (lower.as_str(), 1),
        },
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("expected a size like 1048576, 512k or 1m, not {s:?}"))
}

/// `true`/`false` and their usual spellings (`1`, `yes`, `on`, ...).
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!("expected true or false, not {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_booleans() {
        assert_eq!(parse_size("4m"), Ok(4 << 20));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("12q").is_err());
        assert_eq!(parse_bool("Yes"), Ok(true));
        assert!(parse_bool("maybe").is_err());
    }

    /// On a clock the test gives (a loaded machine could let 50 ms pass
    /// between two calls).
    #[test]
    fn a_throttled_warning_is_logged_once_per_interval() {
        let t = Throttled::new("x", std::time::Duration::from_millis(50));
        assert!(t.note_at(&"first", 0), "the first one is logged");
        assert!(!t.note_at(&"again", 10) && !t.note_at(&"again", 49), "then not within the interval");
        assert!(t.note_at(&"later", 50), "and again after it");
        assert!(!t.note_at(&"again", 60), "then not within the next interval");
        assert_eq!(t.unlogged.load(std::sync::atomic::Ordering::Relaxed), 1, "the one not logged since");
    }
}
