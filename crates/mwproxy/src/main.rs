//! The `mwproxy` binary: parse the command line, start the proxy, stop it
//! cleanly on SIGTERM or SIGINT.

use std::process::ExitCode;

use clap::Parser;
use mwproxy::cli::Cli;
use mwproxy::Proxy;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = cli.log.clone().or_else(|| std::env::var("RUST_LOG").ok()).unwrap_or_else(|| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let config = match cli.to_config().and_then(|c| c.validate().map(|_| c)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mwproxy: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.print_config {
        print!("{}", config.to_toml());
        return ExitCode::SUCCESS;
    }
    let proxy = match Proxy::start(config) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("mwproxy: {e}");
            return ExitCode::from(1);
        }
    };
    let mut signals = match Signals::new([SIGTERM, SIGINT]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mwproxy: cannot install signal handlers: {e}");
            return ExitCode::from(1);
        }
    };
    let stopper = proxy.stopper();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(signal = sig, "stopping: finishing in-flight requests");
                stopper.stop();
            }
        })
        .expect("spawn the signal thread");
    proxy.join();
    tracing::info!("stopped");
    ExitCode::SUCCESS
}
