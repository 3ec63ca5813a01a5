//! The `mwmq` binary: the command line, then the shell every middleware
//! shares (`mwserve::cli::serve`): start, stop cleanly on SIGTERM or SIGINT;
//! `mwmq user add` makes a user entry for the configuration file, `mwmq
//! rebalance` moves queues to the databases placement names.

use std::process::ExitCode;

use mwmq::cli::Cli;
use mwmq::Mq;

fn main() -> ExitCode {
    let cli: Cli = mwserve::cli::parse::<Cli, Mq>();
    if let Some(tool) = &cli.command {
        return match tool.run(&cli, &mut std::io::stdin().lock()) {
            Ok(out) => {
                print!("{out}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("mwmq: {e}");
                ExitCode::from(2)
            }
        };
    }
    let args = cli.server.clone();
    let flags = cli.engine_flags();
    let unread = move |c: &mwmq::Config| mwserve::cli::unread_flags(c.server.engine, &flags);
    mwserve::cli::serve::<Mq>(&args, move || cli.to_config(), unread)
}
