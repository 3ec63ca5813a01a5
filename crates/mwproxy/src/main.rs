//! The `mwproxy` binary: the command line, then the shell every middleware
//! shares (`mwserve::cli::serve`): start, reload on SIGHUP, stop cleanly on SIGTERM or SIGINT.
//! Run as `nutcracker` (or `mwproxy nutcracker`), it reads twemproxy's flags instead;
//! as `mcrouter` (or `mwproxy mcrouter`), mcrouter's.

use std::process::ExitCode;

use mwproxy::cli::Cli;
use mwproxy::Proxy;

fn main() -> ExitCode {
    if let Some(args) = mwproxy::nutcli::nutcracker_args() {
        // Started as nutcracker (a link of that name, or `mwproxy nutcracker`): its flags.
        return mwproxy::nutcli::main(args);
    }
    if let Some(args) = mwproxy::mccli::mcrouter_args() {
        // Started as mcrouter (a link of that name, or `mwproxy mcrouter`): its flags.
        return mwproxy::mccli::main(args);
    }
    let cli: Cli = mwserve::cli::parse::<Cli, Proxy>();
    if cli.twemproxy_file().is_some() || cli.stats_listen().is_some() {
        // twemproxy's file (its pools in one process) or its stats port.
        return mwproxy::pools::serve(cli);
    }
    cli.serve()
}
