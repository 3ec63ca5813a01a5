//! PING, QUIT, CLIENT, SELECT, COMMAND, INFO, HELLO, AUTH: answered
//! without the database (a login's password is checked off the loop).

use mwserve::throttle::Refused;

use super::{Core, Outcome, Session};
use crate::command::{Command, Credentials};
use crate::resp::Reply;
use crate::users::Checked;
use crate::xcommand::XCmd;

impl Core<'_> {
    /// The outcome of a command answered without the database; `None` for
    /// the others. `checked`: a login's outcome, once its password was
    /// checked (`logins::check`).
    pub fn local<S: Session + ?Sized>(&self, c: &Command, s: &S, checked: Option<Checked>) -> Option<Outcome> {
        let local = |r: Reply| Some(Outcome::ok(r));
        if let Some(refusal) = self.too_many_names(c) {
            return Some(Outcome::Reply(refusal, Vec::new(), "client_error"));
        }
        match c {
            Command::Ping(None) => local(Reply::Simple("PONG")),
            Command::Ping(Some(m)) => local(Reply::Bulk(m.clone())),
            Command::Quit | Command::ClientInfo | Command::Select => local(Reply::Simple("OK")),
            Command::SetName(n) => {
                s.set_name(n.clone());
                local(Reply::Simple("OK"))
            }
            Command::GetName => local(s.name().map(Reply::text).unwrap_or(Reply::Nil)),
            Command::ClientId => local(Reply::Int(s.id() as i64)),
            Command::CommandDocs => local(Reply::Array(Vec::new())),
            Command::Info => local(Reply::text(self.info())),
            Command::Auth(credentials) => match self.log_in(s, credentials, checked) {
                Some(reply) => local(reply),
                None => Some(Outcome::Verify),
            },
            Command::Hello { proto, setname, auth } => {
                if let Some(credentials) = auth {
                    match self.log_in(s, credentials, checked) {
                        None => return Some(Outcome::Verify),
                        Some(reply) if reply.is_error() => return local(reply),
                        Some(_) => {}
                    }
                }
                if let Some(p) = proto {
                    s.set_resp3(*p == 3);
                }
                if let Some(n) = setname {
                    s.set_name(n.clone());
                }
                let t = Reply::text;
                local(Reply::Map(vec![
                    (t("server"), t("mwmq")),
                    (t("version"), t(crate::VERSION)),
                    (t("proto"), Reply::Int(if s.resp3() { 3 } else { 2 })),
                    (t("id"), Reply::Int(s.id() as i64)),
                    (t("mode"), t("standalone")),
                    (t("role"), t("master")),
                    (t("modules"), Reply::Array(Vec::new())),
                ]))
            }
            // QINFO's database figures, if read lately.
            Command::QueueInfo(q) => self.cached_info(q).map(Outcome::ok),
            // The database's (`Core::statement`).
            Command::Send(_)
            | Command::Recv(_)
            | Command::Ack { .. }
            | Command::Nack { .. }
            | Command::Pop { .. }
            | Command::Peek { .. }
            | Command::Touch { .. }
            | Command::Create(..)
            | Command::Alter(..)
            | Command::Pause(..)
            | Command::Archive { .. }
            | Command::DeadLetters { .. }
            | Command::Redrive { .. }
            | Command::Drop(_)
            | Command::Len(_)
            | Command::List { .. }
            | Command::Schedule(_)
            | Command::Unschedule(_)
            | Command::Schedules
            | Command::Stream(_) => None,
        }
    }

    /// A waiting request over more names than `queues.max_wait_names`
    /// (XREAD BLOCK over many keys) is refused: each name is watched and
    /// asked about while it waits.
    fn too_many_names(&self, c: &Command) -> Option<Reply> {
        let (names, _) = c.wait()?;
        let cap = self.shared.config.queues.max_wait_names;
        let what = match c {
            Command::Stream(XCmd::ReadGroup { .. }) => "XREADGROUP ... BLOCK",
            Command::Stream(_) => "XREAD ... BLOCK",
            _ => "RECV ... WAIT",
        };
        (names.len() > cap).then(|| {
            Reply::err(format!(
                "{what} waits on at most {cap} keys ({} given; queues.max_wait_names): \
                 split them over several connections",
                names.len()
            ))
        })
    }

    /// `AUTH` and `HELLO ... AUTH`: the connection becomes the user, or
    /// hears Redis's refusal; `None`: the password is to be checked (off
    /// the loop or worker, `logins::check`; the request comes back with the
    /// outcome in `checked`). Failed attempts are counted, make the
    /// connection wait before its next one is checked, and count against its
    /// source address and the user name; a throttled attempt is refused
    /// without a check, and so is a password that failed lately from the
    /// same source for the same user (answered as wrong, not counted again).
    fn log_in<S: Session + ?Sized>(&self, s: &S, credentials: &Credentials, checked: Option<Checked>) -> Option<Reply> {
        use std::sync::atomic::Ordering::Relaxed;
        let users = &self.shared.users;
        if !users.enabled() {
            return Some(Reply::err(
                "AUTH <password> called without any password configured for the default user. Are you sure your \
                 configuration is correct?",
            ));
        }
        let wrong = || Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".into());
        // Refused unchecked, and told so (never WRONGPASS: the password may
        // be right). `-ERR`, which every Redis client raises with its message.
        let throttled = |why: String| {
            users.failures.fetch_add(1, Relaxed);
            Some(Reply::Error(format!("ERR {why}")))
        };
        let checked = match checked {
            Some(c) => c,
            None => {
                if let Some(secs) = s.attempts().wait() {
                    return throttled(format!("too many failed logins on this connection; retry in {secs} s"));
                }
                let a = crate::logins::attempt(s.peer(), credentials, "AUTH");
                match self.shared.logins.throttle.check(&a) {
                    Ok(()) => return None,
                    Err(Refused::Repeated) => {
                        users.failures.fetch_add(1, Relaxed);
                        Checked::Refused(Refused::Repeated)
                    }
                    Err(refused) => Checked::Refused(refused),
                }
            }
        };
        match checked {
            Checked::User(user) => {
                s.attempts().succeeded();
                s.set_user(user);
                Some(Reply::Simple("OK"))
            }
            Checked::Wrong | Checked::Refused(Refused::Repeated) => {
                s.attempts().failed();
                Some(wrong())
            }
            Checked::Refused(Refused::Throttled(t)) => throttled(t.to_string()),
        }
    }

    /// INFO's text.
    pub fn info(&self) -> String {
        let s = self.shared;
        let acc = s.telemetry.everything();
        let (open, idle) = s.pool.occupancy();
        let net = s.net.snapshot();
        let mut t = String::new();
        let mut line = |k: &str, v: String| {
            t.push_str(k);
            t.push(':');
            t.push_str(&v);
            t.push_str("\r\n");
        };
        line("# Server\r\nmwmq_version", crate::VERSION.to_string());
        line("process_id", std::process::id().to_string());
        line("tcp_port", s.port.to_string());
        line("uptime_in_seconds", s.started.elapsed().as_secs().to_string());
        line("engine", s.config.server.engine.to_string());
        line("workers", s.config.server.workers.to_string());
        line(
            "\r\n# Clients\r\nconnected_clients",
            s.open_connections.load(std::sync::atomic::Ordering::Relaxed).to_string(),
        );
        line("maxclients", s.max_connections.to_string());
        line("blocked_clients", s.waiters.parked().to_string());
        line("waits_abandoned", s.waiters.abandoned.load(std::sync::atomic::Ordering::Relaxed).to_string());
        line("\r\n# Stats\r\ntotal_connections_received", net.accepted.to_string());
        line("total_commands_processed", acc.stages.requests().to_string());
        line("rejected_connections", net.rejected.to_string());
        line("total_net_input_bytes", net.bytes_in.to_string());
        line("total_net_output_bytes", net.bytes_out.to_string());
        line("queue_length", s.queue.len().to_string());
        line("leases_released", net.leases_released.to_string());
        line("tls_handshake_failures", net.tls_handshake_failures.to_string());
        line("handshake_timeouts", net.handshake_timeouts.to_string());
        line("handshake_refused", net.handshake_refused.to_string());
        line("login_timeouts", net.login_timeouts.to_string());
        let out = s.output.snapshot();
        line("output_budget", out.limit.to_string());
        line("output_held_bytes", out.held.to_string());
        line("output_peak_bytes", out.peak.to_string());
        line("output_waiting", out.waiting.to_string());
        line("output_delayed", out.delayed.to_string());
        line("stalled_readers_closed", net.stalled_readers.to_string());
        line("statements_cut", s.pool.cut().to_string());
        line("auth_users", if s.users.enabled() { "yes" } else { "no" }.to_string());
        line("auth_failures", s.users.failures.load(std::sync::atomic::Ordering::Relaxed).to_string());
        line("auth_throttled", s.logins.throttle.refused.load(std::sync::atomic::Ordering::Relaxed).to_string());
        line("auth_repeated", s.logins.throttle.repeated.load(std::sync::atomic::Ordering::Relaxed).to_string());
        line("logins_waiting", s.logins.waiting().to_string());
        line("\r\n# Database\r\npool_size", s.pool.size().to_string());
        line("pool_open", open.to_string());
        line("pool_idle", idle.to_string());
        line("db_statements", acc.db_requests.to_string());
        line("wait_polls", s.waiters.polls.load(std::sync::atomic::Ordering::Relaxed).to_string());
        line("wake_hints", s.waiters.hints.load(std::sync::atomic::Ordering::Relaxed).to_string());
        line(
            "wake_hints_overflowed",
            s.waiters.hints_overflowed.load(std::sync::atomic::Ordering::Relaxed).to_string(),
        );
        line("db_errors", acc.db_errors.to_string());
        line("db_unavailable", acc.db_unavailable.to_string());
        let pools = &s.pool;
        line("databases", pools.len().to_string());
        line("queues_not_moved", pools.misplaced().to_string());
        line("db_server", pools.servers());
        line("db_up", u8::from(!pools.down()).to_string());
        line("db_failovers", pools.failovers().to_string());
        line("db_outages", pools.outages().to_string());
        line("db_seconds_without_primary", format!("{:.3}", pools.down_seconds(mwstats::clock::now_ns())));
        line("vacuums", s.vacuums.load(std::sync::atomic::Ordering::Relaxed).to_string());
        let replies = &s.stream_replies;
        line("stream_replies_refused", replies.refused.load(std::sync::atomic::Ordering::Relaxed).to_string());
        line("stream_replies_cut", replies.cut.load(std::sync::atomic::Ordering::Relaxed).to_string());
        t
    }
}
