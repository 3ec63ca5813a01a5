//! `mwdist`: writes what the packages of mwproxy, mwmq and mwload ship
//! beside the binaries and is made from their command lines — a man page per
//! program (and per subcommand), and completions for bash, zsh and fish — so
//! that neither can drift from the flags the binaries take.
//!
//! ```text
//! mwdist OUT [--sysconfdir /etc]
//!   OUT/man/man1/mwproxy.1, mwproxy-nutcracker.1, mwmq.1, mwmq-user.1, ..., mwload.1
//!   OUT/completions/bash/mwproxy, OUT/completions/zsh/_mwproxy, OUT/completions/fish/mwproxy.fish, ...
//! ```
//!
//! `scripts/dist.sh` runs it for `make install` and `make deb` and puts the
//! files where each system looks for them. The command lines are the
//! binaries' own (`mwserve::cli::command`, the same defaults in the help);
//! what a man page says beyond the flags (files, signals, exit status) is in
//! `programs.rs`.

mod man;
mod programs;

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use clap_complete::Shell;

/// Writes the man pages and shell completions of mwproxy, mwmq and mwload.
#[derive(Parser, Debug)]
#[command(name = "mwdist", version, about, long_about = None)]
struct Args {
    /// The directory to write man/man1/ and completions/{bash,zsh,fish}/ into.
    out: PathBuf,
    /// Where the configuration files are installed, as the man pages name them.
    #[arg(long, value_name = "DIR", default_value = "/etc")]
    sysconfdir: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let man_dir = args.out.join("man").join("man1");
    std::fs::create_dir_all(&man_dir).with_context(|| format!("cannot create {}", man_dir.display()))?;
    for program in programs::all(&args.sysconfdir) {
        for (name, page) in man::pages(&program)? {
            let path = man_dir.join(format!("{name}.1"));
            std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
        }
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let dir = args.out.join("completions").join(shell.to_string());
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            let file = match shell {
                Shell::Zsh => format!("_{}", program.name),
                Shell::Fish => format!("{}.fish", program.name),
                _ => program.name.to_string(),
            };
            let mut text = Vec::new();
            clap_complete::generate(shell, &mut (program.command)(), program.name, &mut text);
            let path = dir.join(file);
            std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    Ok(())
}
