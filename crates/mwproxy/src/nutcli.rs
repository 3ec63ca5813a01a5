//! twemproxy's command line, so that whatever starts nutcracker (an init
//! script, a unit file, a container's command) starts mwproxy unchanged:
//! mwproxy run under the name `nutcracker` (a link), or as
//! `mwproxy nutcracker ARGS`, reads nutcracker's flags — `-c` its file,
//! `-s`/`-a` the stats port, `-d` a daemon, `-p` a pid file, `-o` a log
//! file, `-v` the log level, `-t` a check of the file, `-D` the stats'
//! descriptions, `-V` the version; `-i` and `-m` are accepted (mwproxy's
//! stats are live and its buffers grow as needed).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;

/// The environment variable a daemon's child is started with (it does not
/// detach again).
const DAEMON_CHILD: &str = "MWPROXY_DAEMON_CHILD";

/// nutcracker's flags.
#[derive(Parser, Debug)]
#[command(name = "nutcracker", about = "mwproxy with twemproxy's command line", disable_version_flag = true)]
pub struct NutCli {
    /// Check the configuration file and exit (0 when it can be served).
    #[arg(short = 't', long = "test-conf")]
    test_conf: bool,
    /// Run as a daemon (detached, in a session of its own).
    #[arg(short = 'd', long = "daemonize")]
    daemonize: bool,
    /// Describe the stats and exit.
    #[arg(short = 'D', long = "describe-stats")]
    describe_stats: bool,
    /// Show the version and exit.
    #[arg(short = 'V', long = "version")]
    version: bool,
    /// Log level, 0 to 11 as twemproxy's (5, the default: informational).
    #[arg(short = 'v', long = "verbose", value_name = "N", value_parser = clap::value_parser!(u8).range(0..=11))]
    verbose: Option<u8>,
    /// Log to this file (default: standard error).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// The configuration file.
    #[arg(short = 'c', long = "conf-file", value_name = "FILE", default_value = "conf/nutcracker.yml")]
    conf_file: PathBuf,
    /// The stats port.
    #[arg(short = 's', long = "stats-port", value_name = "N", default_value_t = crate::cli::STATS_PORT)]
    stats_port: u16,
    /// The stats port's address (twemproxy's default is 0.0.0.0; mwproxy's
    /// is 127.0.0.1 and it warns beyond loopback: the stats are not
    /// authenticated).
    #[arg(short = 'a', long = "stats-addr", value_name = "ADDR", default_value = "127.0.0.1")]
    stats_addr: String,
    /// Accepted for twemproxy's sake: mwproxy's stats are counted live.
    #[arg(short = 'i', long = "stats-interval", value_name = "MS")]
    stats_interval: Option<u64>,
    /// Write the process id to this file (removed at exit).
    #[arg(short = 'p', long = "pid-file", value_name = "FILE")]
    pid_file: Option<PathBuf>,
    /// Accepted for twemproxy's sake (512 to 16777216): mwproxy's buffers grow as needed.
    #[arg(short = 'm', long = "mbuf-size", value_name = "N", value_parser = clap::value_parser!(u64).range(512..=16_777_216))]
    mbuf_size: Option<u64>,
}

/// Whether the process was started as nutcracker: under that name, or as
/// `mwproxy nutcracker ...`. The arguments nutcracker's flags are read from.
pub fn nutcracker_args() -> Option<Vec<OsString>> {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let name = args.first().map(Path::new).and_then(Path::file_name).and_then(|n| n.to_str()).unwrap_or("");
    if name == "nutcracker" {
        return Some(args);
    }
    if args.get(1).is_some_and(|a| a == "nutcracker") {
        args.remove(0);
        return Some(args);
    }
    None
}

/// twemproxy's log levels (0 emergencies … 11 everything) as a log filter.
fn log_filter(verbose: u8) -> &'static str {
    match verbose {
        0..=3 => "error",
        4 => "warn",
        5 | 6 => "info",
        7 | 8 => "debug",
        _ => "trace",
    }
}

/// What the stats document holds, per pool and per server, with what each
/// value is in mwproxy (`-D`).
pub const POOL_STATS: &[(&str, &str)] = &[
    ("client_eof", "client connections closed"),
    ("client_err", "client requests refused as malformed"),
    ("client_connections", "client connections open now"),
    ("server_ejects", "times a server left the ring (ejection)"),
    ("forward_error", "requests whose server failed"),
    ("fragments", "always 0: a multi-key get is split per server without fragment objects"),
];

/// The per-server values of the stats document.
pub const SERVER_STATS: &[(&str, &str)] = &[
    ("server_eof", "always 0: a closed server connection counts as an error"),
    ("server_err", "requests the server failed, not by timing out"),
    ("server_timedout", "requests the server did not answer in time"),
    ("server_connections", "connections open to the server (one per carrier while it is up)"),
    ("server_ejected_at", "when it was last ejected, in microseconds since 1970 (0: never)"),
    ("requests", "requests sent to the server"),
    ("request_bytes", "always 0: not counted"),
    ("responses", "replies received from the server"),
    ("response_bytes", "always 0: not counted"),
    ("in_queue", "requests waiting for the server now"),
    ("in_queue_bytes", "always 0: not counted"),
    ("out_queue", "always 0: not counted"),
    ("out_queue_bytes", "always 0: not counted"),
];

fn describe() -> String {
    let mut out = String::from("pool stats:\n");
    for (k, d) in POOL_STATS {
        out.push_str(&format!("  {k:<20}\"{d}\"\n"));
    }
    out.push_str("\nserver stats:\n");
    for (k, d) in SERVER_STATS {
        out.push_str(&format!("  {k:<20}\"{d}\"\n"));
    }
    out
}

/// `main` for nutcracker's command line.
pub fn main(args: Vec<OsString>) -> ExitCode {
    let nut = NutCli::parse_from(args);
    if nut.version {
        println!("This is mwproxy-{} (twemproxy's command line)", crate::VERSION);
        return ExitCode::SUCCESS;
    }
    if nut.describe_stats {
        print!("{}", describe());
        return ExitCode::SUCCESS;
    }
    let level = log_filter(nut.verbose.unwrap_or(5));
    let mut flags: Vec<OsString> = vec!["mwproxy".into(), "--twemproxy-config".into(), nut.conf_file.clone().into()];
    flags.extend(["--stats-port".into(), nut.stats_port.to_string().into()]);
    flags.extend(["--stats-addr".into(), nut.stats_addr.clone().into(), "--log".into(), level.into()]);
    let cli = match Cli::try_parse_from(flags) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let conf = nut.conf_file.display();
    if nut.test_conf {
        return match crate::pools::read(&cli) {
            Ok(_) => {
                eprintln!("nutcracker: configuration file '{conf}' syntax is ok");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nutcracker: configuration file '{conf}' syntax is invalid: {e}");
                ExitCode::from(1)
            }
        };
    }
    if nut.daemonize {
        if std::env::var_os(DAEMON_CHILD).is_none() {
            return detach();
        }
        // The daemon: a session of its own, without the terminal.
        let _ = rustix::process::setsid();
    }
    if let Err(e) = mwserve::process::init_logging_to(Some(level), Default::default(), nut.output.as_deref()) {
        eprintln!("nutcracker: cannot log to {}: {e}", nut.output.as_deref().unwrap_or(Path::new("-")).display());
        return ExitCode::from(1);
    }
    if let Some(pid) = &nut.pid_file {
        if let Err(e) = std::fs::write(pid, format!("{}\n", std::process::id())) {
            eprintln!("nutcracker: cannot write the pid file {}: {e}", pid.display());
            return ExitCode::from(1);
        }
    }
    if nut.stats_interval.is_some() || nut.mbuf_size.is_some() {
        tracing::debug!("-i and -m are accepted and not needed: stats are live, buffers grow as needed");
    }
    let code = crate::pools::serve(cli);
    if let Some(pid) = &nut.pid_file {
        let _ = std::fs::remove_file(pid);
    }
    code
}

/// `-d`: the same command again, detached (it makes a session of its own,
/// without the terminal; standard streams on /dev/null); this process exits 0 once the
/// child is running, or with the child's code when it stopped at once.
fn detach() -> ExitCode {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("nutcracker: cannot find its own program to daemonize: {e}");
            return ExitCode::from(1);
        }
    };
    let mut cmd = std::process::Command::new(exe);
    let args: Vec<OsString> = std::env::args_os().collect();
    cmd.arg0(&args[0]).args(&args[1..]).env(DAEMON_CHILD, "1");
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nutcracker: cannot daemonize: {e}");
            return ExitCode::from(1);
        }
    };
    // A file that cannot be served stops the child at once: say so here.
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!("nutcracker: the daemon stopped at start ({status}); run without -d to see why");
            return ExitCode::from(status.code().unwrap_or(1).clamp(1, 255) as u8);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twemproxy_levels_map_to_log_filters() {
        assert_eq!(log_filter(0), "error");
        assert_eq!(log_filter(5), "info");
        assert_eq!(log_filter(11), "trace");
    }

    #[test]
    fn nutcrackers_flags_parse_as_it_documents_them() {
        let n = NutCli::try_parse_from([
            "nutcracker",
            "-d",
            "-c",
            "/etc/n.yml",
            "-p",
            "/run/n.pid",
            "-v",
            "6",
            "-m",
            "512",
        ])
        .unwrap();
        assert!(n.daemonize && n.conf_file == Path::new("/etc/n.yml") && n.verbose == Some(6));
        assert_eq!((n.stats_port, n.stats_addr.as_str()), (22222, "127.0.0.1"));
        assert!(NutCli::try_parse_from(["nutcracker", "-v", "12"]).is_err());
        assert!(NutCli::try_parse_from(["nutcracker", "-m", "100"]).is_err());
    }

    #[test]
    fn the_description_lists_pool_then_server_stats() {
        let text = describe();
        let (pool, server) = text.split_once("server stats:").unwrap();
        assert!(POOL_STATS.iter().all(|(k, _)| pool.contains(&format!("  {k} "))));
        assert!(SERVER_STATS.iter().all(|(k, _)| server.contains(&format!("  {k} "))));
    }
}
