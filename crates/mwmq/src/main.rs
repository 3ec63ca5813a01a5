//! The `mwmq` binary: the command line, then the shell every middleware
//! shares (`mwserve::cli::serve`): start, stop cleanly on SIGTERM or SIGINT.

use std::process::ExitCode;

use mwmq::cli::Cli;
use mwmq::Mq;

fn main() -> ExitCode {
    let cli: Cli = mwserve::cli::parse::<Cli, mwmq::Config>();
    let args = cli.server.clone();
    mwserve::cli::serve::<Mq>(&args, move || cli.to_config())
}
