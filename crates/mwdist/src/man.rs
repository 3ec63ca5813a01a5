//! Man pages (roff, section 1) from a program's command line: clap_mangen
//! writes the NAME, SYNOPSIS, DESCRIPTION, OPTIONS, SUBCOMMANDS and VERSION
//! sections from the flags; the program's own sections (`programs.rs`)
//! follow. Each subcommand gets a page of
//! its own (`mwmq-user-add.1`), as `SUBCOMMANDS` refers to them.

use clap::Command;
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;

use crate::programs::{Part, Program, Section};

/// Every page of `program`: (name, roff text), the program's own first.
pub fn pages(program: &Program) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut cmd = plain_about((program.command)()).disable_help_subcommand(true);
    cmd.build();
    out.push((program.name.to_string(), page(&cmd, &program.sections)?));
    subcommand_pages(&cmd, &mut out)?;
    for other in &program.also {
        let mut other = other.clone();
        other.build();
        let name = other.get_display_name().unwrap_or_else(|| other.get_name()).to_string();
        out.push((name, page(&other, &[])?));
    }
    Ok(out)
}

/// The pages of `cmd`'s subcommands, theirs after each.
fn subcommand_pages(cmd: &Command, out: &mut Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = sub.get_display_name().unwrap_or_else(|| sub.get_name()).to_string();
        out.push((name, page(sub, &[])?));
        subcommand_pages(sub, out)?;
    }
    Ok(())
}

/// The NAME line reads `mwproxy - a memcached middleware ...`: an `about`
/// that starts with the program's own name ("mwproxy: ...") would say it twice.
fn plain_about(cmd: Command) -> Command {
    let prefix = format!("{}: ", cmd.get_name());
    match cmd.get_about().map(ToString::to_string) {
        Some(about) if about.starts_with(&prefix) => {
            let rest = about[prefix.len()..].to_string();
            cmd.about(rest)
        }
        _ => cmd,
    }
}

/// One page: clap_mangen's sections, then `extra` (SEE ALSO last, as man pages have it).
fn page(cmd: &Command, extra: &[Section]) -> std::io::Result<Vec<u8>> {
    let man = Man::new(cmd.clone()).manual("mwlab");
    let mut w = Vec::new();
    man.render_title(&mut w)?;
    man.render_name_section(&mut w)?;
    man.render_synopsis_section(&mut w)?;
    man.render_description_section(&mut w)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut w)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut w)?;
    }
    if cmd.get_after_long_help().is_some() || cmd.get_after_help().is_some() {
        man.render_extra_section(&mut w)?;
    }
    if cmd.get_version().is_some() {
        man.render_version_section(&mut w)?;
    }
    let mut roff = Roff::new();
    for s in extra {
        roff.control("SH", [s.title]);
        for part in &s.parts {
            match part {
                Part::Para(text) => {
                    roff.control("PP", []);
                    roff.text([roman(text.as_str())]);
                }
                Part::Item(term, text) => {
                    roff.control("TP", []);
                    roff.text([bold(term.as_str())]);
                    roff.text([roman(text.as_str())]);
                }
            }
        }
    }
    roff.to_writer(&mut w)?;
    Ok(w)
}
