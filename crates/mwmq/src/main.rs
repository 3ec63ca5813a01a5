//! The `mwmq` binary: parse the command line, start, stop cleanly on SIGTERM or SIGINT.

use std::process::ExitCode;

use clap::Parser;
use mwmq::cli::Cli;
use mwmq::Mq;

fn main() -> ExitCode {
    let cli = Cli::parse();
    mwserve::process::init_logging(cli.log.as_deref());
    let config = match cli.to_config().and_then(|c| c.validate().map(|_| c)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mwmq: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.print_config {
        print!("{}", config.to_toml());
        return ExitCode::SUCCESS;
    }
    let mq = match Mq::start(config) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("mwmq: {e}");
            return ExitCode::from(1);
        }
    };
    let stopper = mq.stopper();
    if let Err(e) = mwserve::process::stop_on_signals(move || stopper.stop()) {
        eprintln!("mwmq: cannot install signal handlers: {e}");
        return ExitCode::from(1);
    }
    mq.join();
    tracing::info!("stopped");
    ExitCode::SUCCESS
}
