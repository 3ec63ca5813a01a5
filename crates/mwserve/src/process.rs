//! What every middleware binary does around its work: logging, stopping on
//! SIGTERM or SIGINT, and the command line's sizes and booleans.

/// Logs to standard error with `filter` (`error`, `warn`, `info`, `debug`,
/// `trace`, or a tracing filter), else `RUST_LOG`, else `info`.
pub fn init_logging(filter: Option<&str>) {
    let filter = filter.map(str::to_string).or_else(|| std::env::var("RUST_LOG").ok()).unwrap_or_else(|| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Calls `stop` (on a thread of its own) when SIGTERM or SIGINT arrives.
pub fn stop_on_signals(stop: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        if let Some(sig) = signals.forever().next() {
            tracing::info!(signal = sig, "stopping: finishing in-flight requests");
            stop();
        }
    })?;
    Ok(())
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

/// An admin address with a bare port expanded to loopback.
pub fn admin_addr(a: &str) -> String {
    if a.parse::<u16>().is_ok() {
        format!("127.0.0.1:{a}")
    } else {
        a.to_string()
    }
}

/// Connections the kernel completes before the net thread accepts them
/// (std's listeners take 128: a burst of connecting clients overflows it, and
/// each SYN dropped costs its client a second before retrying).
pub const LISTEN_BACKLOG: i32 = 1024;

/// A listening socket on `addr` with a backlog of [`LISTEN_BACKLOG`] (capped by
/// the kernel's `net.core.somaxconn`).
pub fn bind_listener(addr: &str) -> std::io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)?;
    // Listening again on a listening socket changes its backlog.
    rustix::net::listen(&l, LISTEN_BACKLOG)?;
    Ok(l)
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
        assert_eq!(admin_addr("9100"), "127.0.0.1:9100");
        assert_eq!(admin_addr("0.0.0.0:9100"), "0.0.0.0:9100");
    }
}
