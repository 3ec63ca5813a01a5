//! The `mwload` binary: parse the command line, run, print the table, and
//! exit non-zero when the run should not be trusted.

use std::process::ExitCode;

use clap::Parser;
use mwload::config::Args;
use mwload::run::{run, table};

fn main() -> ExitCode {
    let args = Args::parse();
    let cfg = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mwload: {e}");
            return ExitCode::from(2);
        }
    };
    let max_error_rate = cfg.max_error_rate;
    let outcome = match run(cfg) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("mwload: {e:#}");
            return ExitCode::from(1);
        }
    };
    print!("{}", table(&outcome));
    let all = outcome.measured.all();
    let conns = outcome.connections;
    if conns.down() > 0 {
        eprintln!(
            "mwload: {} connection(s) lost during the run{}",
            conns.down(),
            if conns.reconnected > 0 {
                format!(" ({} more lost and re-established)", conns.reconnected)
            } else {
                String::new()
            }
        );
        return ExitCode::from(1);
    }
    if conns.lost > 0 {
        eprintln!("mwload: {} connection(s) lost and re-established during the run", conns.lost);
    }
    if all.count == 0 {
        eprintln!("mwload: no request completed in the measurement phase");
        return ExitCode::from(1);
    }
    // Open-loop arrivals that could not be sent failed as much as errors did.
    let unsent = outcome.measured.unsent;
    let (failed, due) = (all.errors + unsent, all.count + unsent);
    let rate = failed as f64 / due as f64;
    if rate > max_error_rate {
        let not_sent =
            if unsent > 0 { format!(", {unsent} of them not sent for want of a connection") } else { String::new() };
        eprintln!(
            "mwload: {failed} of {due} requests failed{not_sent} ({:.2}%, above --max-error-rate {:.2}%)",
            rate * 100.0,
            max_error_rate * 100.0
        );
        return ExitCode::from(3);
    }
    if outcome.measured.verify_failures > 0 {
        eprintln!("mwload: {} values read back were not what was written", outcome.measured.verify_failures);
        return ExitCode::from(4);
    }
    ExitCode::SUCCESS
}
