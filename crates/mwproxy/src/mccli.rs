//! mcrouter's command line, so that what starts mcrouter starts mwproxy:
//! run under the name `mcrouter` (a link), or as `mwproxy mcrouter ARGS`,
//! mwproxy reads mcrouter's flags — `-f`/`--config-file` (or
//! `--config file:PATH`) the JSON file, `--config-str JSON` (or `--config
//! JSON`) the JSON itself, `-R`/`--route-prefix` the routing prefix whose
//! `routes` entry is served, `-p`/`--port` the port,
//! `--listen-addresses` the address, `--num-proxies` the threads,
//! `--validate-config` a check of the file — and serves its pools and route
//! (`routes/mcrouter.rs`). Other mcrouter flags are refused by name.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;

/// mcrouter's flags that mwproxy takes.
#[derive(Parser, Debug)]
#[command(name = "mcrouter", about = "mwproxy with mcrouter's command line", disable_version_flag = true)]
pub struct McCli {
    /// The JSON configuration file.
    #[arg(short = 'f', long = "config-file", value_name = "FILE")]
    config_file: Option<PathBuf>,
    /// The configuration as `file:PATH`, or the JSON itself (mcrouter's newer form).
    #[arg(long = "config", value_name = "file:PATH|JSON")]
    config: Option<String>,
    /// The JSON configuration itself.
    #[arg(long = "config-str", value_name = "JSON")]
    config_str: Option<String>,
    /// The routing prefix this host serves (/region/cluster/): the `routes` entry whose aliases hold it.
    #[arg(short = 'R', long = "route-prefix", value_name = "PREFIX")]
    route_prefix: Option<String>,
    /// The port to listen on (one).
    #[arg(short = 'p', long = "port", value_name = "PORT")]
    port: Option<u16>,
    /// The address to listen on (one; mwproxy's default is 127.0.0.1).
    #[arg(long = "listen-addresses", value_name = "ADDR", default_value = "127.0.0.1")]
    listen_addresses: String,
    /// Event loops (mcrouter's proxy threads).
    #[arg(long = "num-proxies", value_name = "N")]
    num_proxies: Option<usize>,
    /// Check the configuration and exit (0 when it can be served).
    #[arg(long = "validate-config", value_name = "exit|run", num_args = 0..=1, default_missing_value = "exit")]
    validate_config: Option<String>,
    /// Show the version and exit.
    #[arg(short = 'V', long = "version")]
    version: bool,
}

/// Whether the process was started as mcrouter: under that name, or as
/// `mwproxy mcrouter ...`. The arguments mcrouter's flags are read from.
pub fn mcrouter_args() -> Option<Vec<OsString>> {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let name = args.first().map(Path::new).and_then(Path::file_name).and_then(|n| n.to_str()).unwrap_or("");
    if name == "mcrouter" {
        return Some(args);
    }
    if args.get(1).is_some_and(|a| a == "mcrouter") {
        args.remove(0);
        return Some(args);
    }
    None
}

/// mwproxy's own command line for mcrouter's flags.
pub fn translate(mc: &McCli) -> Result<Vec<OsString>, String> {
    let source: [OsString; 2] = match (&mc.config_file, &mc.config_str, &mc.config) {
        (Some(f), None, None) => ["--mcrouter-config".into(), f.into()],
        (None, Some(json), None) => ["--mcrouter-config-str".into(), json.into()],
        (None, None, Some(c)) => match c.strip_prefix("file:") {
            Some(path) => ["--mcrouter-config".into(), path.into()],
            None if c.trim_start().starts_with('{') => ["--mcrouter-config-str".into(), c.into()],
            None => return Err(format!("--config {c:?}: only file:PATH or the JSON itself is read")),
        },
        (None, None, None) => return Err("no configuration: give -f FILE (mcrouter's JSON)".into()),
        _ => return Err("give one of -f/--config-file, --config-str and --config".into()),
    };
    let Some(port) = mc.port else { return Err("no port: give -p PORT".into()) };
    if mc.listen_addresses.contains(',') {
        return Err(format!("--listen-addresses {}: mwproxy listens on one address", mc.listen_addresses));
    }
    let host = &mc.listen_addresses;
    let listen = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    let mut flags: Vec<OsString> = vec!["mwproxy".into()];
    flags.extend(source);
    flags.extend(["--listen".into(), listen.into()]);
    if let Some(prefix) = &mc.route_prefix {
        flags.extend(["--route-prefix".into(), prefix.into()]);
    }
    if let Some(n) = mc.num_proxies {
        flags.extend(["--threads".into(), n.to_string().into()]);
    }
    Ok(flags)
}

/// `main` for mcrouter's command line.
pub fn main(args: Vec<OsString>) -> ExitCode {
    let mc = McCli::parse_from(args);
    if mc.version {
        println!("mcrouter command line of mwproxy-{}", crate::VERSION);
        return ExitCode::SUCCESS;
    }
    let flags = match translate(&mc) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("mcrouter: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = match Cli::try_parse_from(flags) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if mc.validate_config.is_some() {
        let checked = cli.to_config().and_then(|c| mwserve::config::ServiceConfig::validate(&c).map(|()| c));
        if let Err(e) = checked {
            eprintln!("mcrouter: invalid configuration: {e}");
            return ExitCode::from(1);
        }
        if mc.validate_config.as_deref() == Some("exit") {
            eprintln!("mcrouter: configuration is valid");
            return ExitCode::SUCCESS;
        }
    }
    cli.serve()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Result<Vec<String>, String> {
        let mc = McCli::try_parse_from(std::iter::once("mcrouter").chain(args.iter().copied())).unwrap();
        translate(&mc).map(|f| f.into_iter().map(|s| s.into_string().unwrap()).collect())
    }

    #[test]
    fn mcrouter_flags_become_mwproxy_flags() {
        let f = flags(&["-f", "/etc/mcrouter.json", "-p", "5000", "--num-proxies", "2"]).unwrap();
        assert_eq!(f[1..], ["--mcrouter-config", "/etc/mcrouter.json", "--listen", "127.0.0.1:5000", "--threads", "2"]);
        let f = flags(&["--config", "file:/x.json", "-p", "1", "--listen-addresses", "::1"]).unwrap();
        assert_eq!(f[2..5], ["/x.json", "--listen", "[::1]:1"]);
        assert!(flags(&["-f", "x.json"]).unwrap_err().contains("-p"));
        assert!(flags(&["--config", "zk:/x", "-p", "1"]).unwrap_err().contains("file:PATH"));
        // The JSON itself, and the routing prefix.
        let json = r#"{"route": "Pool|A"}"#;
        let f = flags(&["--config-str", json, "-p", "1", "-R", "/r/c/"]).unwrap();
        assert_eq!(f[1..], ["--mcrouter-config-str", json, "--listen", "127.0.0.1:1", "--route-prefix", "/r/c/"]);
        assert_eq!(flags(&["--config", json, "-p", "1"]).unwrap()[1..3], ["--mcrouter-config-str", json]);
        assert!(flags(&["-f", "x.json", "--config-str", json, "-p", "1"]).unwrap_err().contains("one of"));
        assert!(
            McCli::try_parse_from(["mcrouter", "--big-value-split-threshold", "1"]).is_err(),
            "other flags are refused"
        );
    }
}
