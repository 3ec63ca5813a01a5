//! The packaged programs: each one's command line, taken from the crate
//! that parses it, and what its man page says beyond the flags — the files
//! the packages install, the signals, the exit status — as the binaries and
//! `packaging/` do it (the package tests render the pages and check the
//! files they name are there).

use clap::{Command, CommandFactory};

/// A program a package ships.
pub struct Program {
    /// Its name: the binary's, the man page's and the completions'.
    pub name: &'static str,
    /// Its command line as the binary parses it.
    pub command: fn() -> Command,
    /// Pages of other command lines it has (mwproxy's twemproxy mode).
    pub also: Vec<Command>,
    /// What its page says after the flags.
    pub sections: Vec<Section>,
}

/// A section of a man page written here.
pub struct Section {
    /// Its heading (NAME, FILES, ...).
    pub title: &'static str,
    /// Its paragraphs and tagged items, in order.
    pub parts: Vec<Part>,
}

/// A piece of a section.
pub enum Part {
    /// A paragraph.
    Para(String),
    /// A term and its description (a signal, a file, an exit status).
    Item(String, String),
}

fn para(s: impl Into<String>) -> Part {
    Part::Para(s.into())
}

fn item(term: impl Into<String>, what: impl Into<String>) -> Part {
    Part::Item(term.into(), what.into())
}

fn section(title: &'static str, parts: Vec<Part>) -> Section {
    Section { title, parts }
}

/// The log filter, the same for both services.
fn environment(name: &str) -> Section {
    section(
        "ENVIRONMENT",
        vec![item(
            "RUST_LOG",
            format!(
                "The log filter when --log is not given (e.g. warn, or info,{name}=debug). Logs go to standard \
                 error (the journal under systemd)."
            ),
        )],
    )
}

/// mwproxy, mwmq and mwload; `etc` is where the configuration files are installed.
pub fn all(etc: &str) -> Vec<Program> {
    vec![mwproxy(etc), mwmq(etc), mwload()]
}

fn mwproxy(etc: &str) -> Program {
    let nutcracker = mwproxy::nutcli::NutCli::command()
        .name("mwproxy-nutcracker")
        .bin_name("mwproxy nutcracker")
        .about("mwproxy with twemproxy's (nutcracker's) command line");
    Program {
        name: "mwproxy",
        command: || mwserve::cli::command::<mwproxy::cli::Cli, mwproxy::Proxy>(),
        also: vec![nutcracker],
        sections: vec![
            section(
                "FILES",
                vec![item(
                    format!("{etc}/mwproxy/mwproxy.toml"),
                    "The configuration the packaged service (mwproxy.service) starts with: TOML, every setting \
                     commented with its default; flags given on the command line override it. A twemproxy \
                     configuration (nutcracker.yml) is read as well when the file's name ends in .yml or .yaml.",
                )],
            ),
            section(
                "SIGNALS",
                vec![
                    item(
                        "SIGHUP",
                        "Reads the configuration file again: the servers, the routing, the timeouts and the \
                         logins take effect without dropping clients; what needs a restart (the listen addresses, \
                         the engine and its threads, the budgets) keeps its running value and the log names it. A \
                         file it refuses is logged and the running configuration stays. systemctl reload mwproxy \
                         sends it; POST /reload on the admin endpoint does the same.",
                    ),
                    item("SIGTERM, SIGINT", "Stops accepting clients, answers the requests in flight and exits 0."),
                ],
            ),
            environment("mwproxy"),
            section(
                "EXIT STATUS",
                vec![
                    item("0", "Stopped by a signal after answering what was in flight."),
                    item("1", "It could not start (the address is taken, a file cannot be read)."),
                    item("2", "The command line or the configuration was refused; the message says what to change."),
                ],
            ),
            section(
                "TWEMPROXY'S COMMAND LINE",
                vec![para(
                    "Run under the name nutcracker (a link), or as mwproxy nutcracker ARGS, mwproxy reads \
                     twemproxy's flags instead: see mwproxy-nutcracker(1).",
                )],
            ),
            section("SEE ALSO", vec![para("mwproxy-nutcracker(1), memcached(1), mwload(1), mwmq(1), systemctl(1)")]),
        ],
    }
}

fn mwmq(etc: &str) -> Program {
    Program {
        name: "mwmq",
        command: || mwserve::cli::command::<mwmq::cli::Cli, mwmq::Mq>(),
        also: Vec::new(),
        sections: vec![
            mwmq_commands(),
            section(
                "FILES",
                vec![item(
                    format!("{etc}/mwmq/mwmq.toml"),
                    "The configuration the packaged service (mwmq.service) starts with: TOML, every setting \
                     commented with its default; flags given on the command line override it. It may hold \
                     [[users]] with password hashes, so it is readable by root and the mwmq group only \
                     (mwmq refuses a file with secrets that every user may read).",
                )],
            ),
            section(
                "SIGNALS",
                vec![
                    item(
                        "SIGTERM, SIGINT",
                        "Stops accepting clients, answers what is in flight (waiting RECV and XREADGROUP get their \
                         empty answer), gives back the leases of replies it could not deliver and exits 0.",
                    ),
                    item(
                        "SIGHUP",
                        "Not a reload: mwmq logs that it does not reload its configuration. Restart it \
                         (systemctl restart mwmq) to apply a changed file.",
                    ),
                ],
            ),
            environment("mwmq"),
            section(
                "EXIT STATUS",
                vec![
                    item("0", "Stopped by a signal after answering what was in flight, or a tool succeeded."),
                    item(
                        "1",
                        "It could not start (the address is taken, the database cannot be reached or refused the \
                         schema).",
                    ),
                    item(
                        "2",
                        "The command line or the configuration was refused, or a tool (mwmq user, mwmq rebalance) \
                         failed; the message says what to change.",
                    ),
                ],
            ),
            section("SEE ALSO", vec![para("redis-cli(1), psql(1), mwproxy(1), mwload(1), systemctl(1)")]),
        ],
    }
}

/// What clients send mwmq over RESP (redis-cli, any Redis client): the
/// flags alone left an operator of the package without them. The full
/// reference of every reply and error is docs/mwmq.md in the sources.
fn mwmq_commands() -> Section {
    section(
        "COMMANDS",
        vec![
            para(
                "Clients send these over RESP to --listen (redis-cli -p 6380 SEND jobs hello). Without [[users]] \
                 anyone who reaches the port may run every one; with them, each needs the user's right on the \
                 queue (send, receive, or admin for QCREATE, QALTER, QDROP, QPAUSE, QRESUME, QARCHIVE, QDEAD, \
                 REDRIVE, QSCHEDULE). docs/mwmq.md in the sources gives every reply and error.",
            ),
            item(
                "QCREATE q [MAXDELIVERIES n] [DEADLETTER q2] [MAXMESSAGES n] [MAXBYTES n] [CONCURRENCY n] \
                 [RATE n/s] [BACKOFF base_ms max_ms [JITTER pct]]",
                "Creates a queue. MAXDELIVERIES: deliveries without an ACK before a message moves to the \
                 DEADLETTER queue (0, the default: it comes back forever). BACKOFF: a message whose lease ran \
                 out, or that was NACKed without DELAY, waits min(max_ms, base_ms x 2^(deliveries-1)), plus or \
                 minus pct percent, before it is handed out again (without BACKOFF: at once).",
            ),
            item(
                "QALTER q [option ...]",
                "Changes QCREATE's options, and RETAIN ms (keep acknowledged messages, read with QARCHIVE), \
                 NODEADLETTER, NOBACKOFF. Each option at most once.",
            ),
            item(
                "QINFO q",
                "A map: ready, delayed, leased, ready_by_priority (ready messages per priority present, highest \
                 first), backoff_base_ms, backoff_max_ms, backoff_jitter_pct (0: no backoff), the limits, paused, \
                 and this process's counts; cached for [queues] info_cache_ms.",
            ),
            item(
                "QLEN q, QLIST [PENDING], QPAUSE q, QRESUME q, QDROP q, QARCHIVE q [COUNT n], QDEAD q [COUNT n], \
                 REDRIVE q2 [TO q] [COUNT n]",
                "Count, list, pause and resume, drop, read what a RETAIN queue kept, read dead letters, move \
                 dead letters back.",
            ),
            item(
                "SEND q body [TO name] [DELAY ms] [KEY k] [GROUP g] [PRIORITY n]",
                "The message id, once committed. PRIORITY 0 to 9, higher handed out first (0 without it); KEY \
                 deduplicates (a repeated KEY answers the first id); GROUP: one of a group at a time, in order.",
            ),
            item(
                "RECV q [FROM sender] [VT ms] [COUNT n] [WAIT ms]",
                "Each message as id, lease, sender, body, leased for VT ms (default 30000), the highest \
                 priority first; WAIT parks the request until a message comes.",
            ),
            item(
                "ACK q id lease, NACK q id lease [DELAY ms], TOUCH q id lease ms, POP q [FROM sender], \
                 PEEK q [FROM sender]",
                "Acknowledge (1, or 0 when the lease is no longer current), give back (after DELAY, else after the \
                 queue's BACKOFF), extend a lease, take and delete at once, look without taking.",
            ),
            item(
                "QSCHEDULE name q cron body [TZ zone] [KEY prefix] [CATCHUP none|one|all] [PRIORITY n] \
                 [GROUP g] [DELAY ms]",
                "A periodic job: SENDs body to q at every tick of the cron expression (five fields, six with \
                 seconds first, or @hourly, @daily, @weekly, @monthly, @yearly) in the IANA zone (UTC), one \
                 message per tick across every mwmq process on the database. Each tick's message carries the \
                 KEY prefix followed by the tick (default prefix: name@), and {tick} in body becomes the tick \
                 (RFC 3339, UTC). Ticks missed while every mwmq was down longer than [queues] schedule_grace_ms: \
                 CATCHUP none (the default) sends none of them, one the latest, all the latest 100. The same \
                 name again replaces the schedule.",
            ),
            item(
                "QUNSCHEDULE name, QSCHEDULES",
                "Remove a schedule (1, or 0: none of that name); list them with next_run_ms, last_run_ms, sent, \
                 missed and state.",
            ),
            item(
                "PING, AUTH, HELLO, CLIENT, INFO, XADD, XREADGROUP, XACK, ...",
                "As Redis: logins, the server's figures, and Redis Streams with Redis 7.0's replies.",
            ),
        ],
    )
}

fn mwload() -> Program {
    Program {
        name: "mwload",
        command: mwload::config::Args::command,
        also: Vec::new(),
        sections: vec![
            section(
                "EXIT STATUS",
                vec![
                    item("0", "The run completed and can be trusted."),
                    item(
                        "1",
                        "The run should not be trusted: connections were lost, no request completed in the \
                         measurement, or more requests failed than --max-error-rate allows.",
                    ),
                    item("2", "The command line was refused; the message says what to change."),
                ],
            ),
            section("SEE ALSO", vec![para("mwproxy(1), mwmq(1), memcached(1)")]),
        ],
    }
}
