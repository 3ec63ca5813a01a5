//! The process that serves a twemproxy file's pools (one mwproxy per pool,
//! each on its own address, in one process), or one mwproxy with twemproxy's
//! stats port beside it: start them, serve the stats, reload every pool on
//! SIGHUP, stop them all on SIGTERM or SIGINT.

use std::process::ExitCode;
use std::sync::Arc;

use mwserve::cli::Service;
use mwserve::config::ServiceConfig;

use crate::cli::Cli;
use crate::config::{Config, ConfigError};
use crate::nutstats::StatsPort;
use crate::Proxy;

/// The pools to serve: from the twemproxy file, or the one configuration of
/// mwproxy's own file and flags (named `mwproxy`).
pub fn read(cli: &Cli) -> Result<Vec<(String, Config)>, ConfigError> {
    let Some(path) = cli.twemproxy_file() else {
        let c = cli.to_config()?;
        c.validate()?;
        return Ok(vec![("mwproxy".to_string(), c)]);
    };
    let pools = crate::twemproxy::read(&path)?;
    let shared = cli.one_pool_flags();
    if pools.len() > 1 && !shared.is_empty() {
        return Err(ConfigError(format!(
            "{} would give all {} pools of {} the same setting: give it in each pool's mwproxy: section",
            shared.join(", "),
            pools.len(),
            path.display()
        )));
    }
    pools
        .iter()
        .map(|p| {
            let c = cli.pool_config(p)?;
            c.validate().map_err(|e| ConfigError(format!("pool {}: {}", p.name, e.0)))?;
            Ok((p.name.clone(), c))
        })
        .collect()
}

/// `main` for a twemproxy file or a stats port.
pub fn serve(cli: Cli) -> ExitCode {
    mwserve::process::init_logging(cli.server.log.as_deref(), cli.server.log_format.unwrap_or_default());
    let pools = match read(&cli) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("mwproxy: {e}");
            return ExitCode::from(2);
        }
    };
    // Once per engine the pools use, not once per pool.
    let mut engines: Vec<_> = pools.iter().map(|(_, c)| c.proxy.engine).collect();
    engines.sort_by_key(|e| e.name());
    engines.dedup();
    for note in engines.into_iter().flat_map(|e| mwserve::cli::unread_flags(e, &cli.engine_flags())) {
        tracing::warn!("{note}");
    }
    if cli.server.print_config {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        for (name, c) in &pools {
            // A reader that stops reading (`| head`) ends the printing, quietly.
            if writeln!(out, "# pool {name}\n{}", c.redacted().to_toml()).is_err() {
                break;
            }
        }
        return ExitCode::SUCCESS;
    }
    // Caught before the first pool listens: a SIGHUP sent as soon as a port opens is a reload.
    let signals = match mwserve::process::catch_signals() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mwproxy: cannot install signal handlers: {e}");
            return ExitCode::from(1);
        }
    };
    let mut running: Vec<(String, Proxy)> = Vec::new();
    for (name, c) in pools {
        match Proxy::start(c) {
            Ok(p) => {
                tracing::info!(pool = %name, addr = %p.address(), "serving");
                running.push((name, p));
            }
            Err(e) => {
                eprintln!("mwproxy: pool {name}: {e}");
                for (_, p) in &running {
                    p.shutdown();
                }
                return ExitCode::from(1);
            }
        }
    }
    let stats = match cli.stats_listen() {
        Some(addr) => match StatsPort::start(&addr, running.iter().map(|(n, p)| (n.clone(), p.shared())).collect()) {
            Ok(s) => {
                tracing::info!(addr = %s.addr(), "twemproxy stats port");
                Some(s)
            }
            Err(e) => {
                eprintln!("mwproxy: stats port {addr}: {e}");
                for (_, p) in &running {
                    p.shutdown();
                }
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    // Each pool reloads from the file as it is then; a file whose pools
    // changed (added, removed, renamed) is refused as a whole.
    let cli = Arc::new(cli);
    let names: Vec<String> = running.iter().map(|(n, _)| n.clone()).collect();
    let reloads: Vec<_> = running
        .iter()
        .filter_map(|(name, p)| {
            let (cli, name, names) = (cli.clone(), name.clone(), names.clone());
            p.reloads(Arc::new(move || {
                let pools = read(&cli).map_err(|e| e.to_string())?;
                let now: Vec<&String> = pools.iter().map(|(n, _)| n).collect();
                if now != names.iter().collect::<Vec<_>>() {
                    return Err(format!(
                        "the file's pools changed ({} now, {} running): pools are added or removed by a restart",
                        now.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", "),
                        names.join(", ")
                    ));
                }
                pools
                    .into_iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, c)| c)
                    .ok_or_else(|| format!("pool {name} is gone"))
            }))
        })
        .collect();
    let stoppers: Vec<_> = running.iter().map(|(_, p)| p.stopper()).collect();
    let reload: mwserve::shell::Reload = Arc::new(move || {
        let mut done = Vec::new();
        for r in &reloads {
            done.push(r()?);
        }
        Ok(done.join("; "))
    });
    if let Err(e) = signals.serve(Box::new(move || stoppers.iter().for_each(|s| s.stop())), Some(reload)) {
        eprintln!("mwproxy: cannot install signal handlers: {e}");
        return ExitCode::from(1);
    }
    for (_, p) in running {
        p.join();
    }
    drop(stats);
    tracing::info!("stopped");
    ExitCode::SUCCESS
}
