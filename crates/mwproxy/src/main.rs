//! The `mwproxy` binary: parse the command line, start the proxy, stop it
//! cleanly on SIGTERM or SIGINT.

use std::process::ExitCode;

use clap::Parser;
use mwproxy::cli::Cli;
use mwproxy::Proxy;

fn main() -> ExitCode {
    let cli = Cli::parse();
    mwserve::process::init_logging(cli.log.as_deref());
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
    let stopper = proxy.stopper();
    if let Err(e) = mwserve::process::stop_on_signals(move || stopper.stop()) {
        eprintln!("mwproxy: cannot install signal handlers: {e}");
        return ExitCode::from(1);
    }
    proxy.join();
    tracing::info!("stopped");
    ExitCode::SUCCESS
}
