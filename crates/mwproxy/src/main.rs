//! The `mwproxy` binary: the command line, then the shell every middleware
//! shares (`mwserve::cli::serve`): start, stop cleanly on SIGTERM or SIGINT.

use std::process::ExitCode;

use mwproxy::cli::Cli;
use mwproxy::Proxy;

fn main() -> ExitCode {
    let cli: Cli = mwserve::cli::parse::<Cli, mwproxy::Config>();
    mwserve::cli::serve::<Proxy>(&cli.server, cli.to_config())
}
