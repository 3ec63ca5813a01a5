//! A red test explains itself: the logs of the processes a test started,
//! and of a middleware it runs as a library, land in the output the test
//! harness shows for a failing test (and only for a failing one).

use std::io::Write;
use std::path::Path;

/// Lines of a log printed when a test fails.
const TAIL_LINES: usize = 40;

/// When the current test is failing (its thread panics), prints the last
/// lines of `path` — the log of a process it started, `what` — into its
/// output, which the test harness shows beside the panic.
pub fn tail_if_failing(what: &str, path: &Path) {
    if std::thread::panicking() {
        // eprint! rather than io::stderr(): the harness captures the former only.
        let mut out = Vec::new();
        write_tail(&mut out, what, path);
        eprint!("{}", String::from_utf8_lossy(&out));
    }
}

/// The last [`TAIL_LINES`] lines of `path`, framed with what they are.
fn write_tail(out: &mut impl Write, what: &str, path: &Path) {
    let _ = match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(TAIL_LINES);
            // The file goes with the test's other files; these lines are what stays.
            let _ = writeln!(
                out,
                "---- {what}: the last {} lines of its log ({}) ----",
                lines.len() - from,
                path.display()
            );
            for l in &lines[from..] {
                let _ = writeln!(out, "{l}");
            }
            writeln!(out, "---- end of {what}'s log ----")
        }
        Err(e) => writeln!(out, "---- {what}: no log at {} ({e}) ----", path.display()),
    };
}

/// Sends the logs of what runs inside the test process (a middleware started
/// as a library) into the output of the test that caused them, at `warn`
/// (`TEST_LOG` sets another filter, such as `debug` or `mwmq=trace`): the
/// harness shows them only for a test that fails. Called by the tests'
/// start helpers; once per process is enough, later calls do nothing.
pub fn capture_logs() {
    let filter = std::env::var("TEST_LOG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .with_ansi(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_is_the_last_lines_framed() {
        let path = std::env::temp_dir().join(format!("mctest-tail-{}.log", std::process::id()));
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let mut out = Vec::new();
        write_tail(&mut out, "memcached", &path);
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), TAIL_LINES + 2, "{out}");
        assert!(lines[0].starts_with("---- memcached: the last 40 lines of its log ("), "{out}");
        assert_eq!((lines[1], lines[TAIL_LINES]), ("line 61", "line 100"));
        std::fs::remove_file(&path).unwrap();
        let mut out = Vec::new();
        write_tail(&mut out, "PostgreSQL", &path);
        assert!(String::from_utf8(out).unwrap().contains("PostgreSQL: no log at"));
    }

    /// Fails on purpose with a memcached running; run by the next test only.
    #[test]
    #[ignore = "fails on purpose: run by a_failing_test_shows_the_log_of_what_it_started"]
    fn fails_with_a_memcached_running() {
        let _m = crate::Memcached::start().unwrap();
        panic!("on purpose");
    }

    #[test]
    fn a_failing_test_shows_the_log_of_what_it_started() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "logs::tests::fails_with_a_memcached_running"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{text}");
        assert!(text.contains("on purpose") && text.contains("---- memcached on port "), "{text}");
        assert!(text.contains("end of memcached on port"), "{text}");
    }
}
