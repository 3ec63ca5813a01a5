//! What a worker does for each command.
//!
//! - Retrievals go to one replica per key (the read policy picks which), are
//!   split by server and sent in parallel, and are merged back in the client's
//!   key order. When every server holds every key (replication = number of
//!   servers) a multi-get is instead split evenly over all servers (`sharded`)
//!   or sent whole to one (`non-sharded`). A failed server's keys move to the
//!   next replica; keys with no replica left are reported missing (`partial`)
//!   or fail the request (`fail`). gets and gat/gats read the primary, so that
//!   cas uniques come from the replica that decides a later cas.
//! - Writes go to all replicas and are answered by the rules of
//!   [`Worker::combine`]; cas is decided by the primary and, when it stored,
//!   copied to the other replicas with a set.
//! - flush_all and verbosity go to every server; version and stats are the
//!   proxy's own.

use std::ops::Range;

use mcproto::request::encode_get;
use mcproto::response::encode_value;
use mcproto::{GetKind, MetaKind, Request, Response, StoreKind};

use crate::config::{MultigetFailure, MultigetMode, ReadPolicy};
use crate::worker::{parsed, Target, Worker};

impl Worker {
    /// Carries out one request and appends the client's reply to `out`.
    pub(crate) fn execute(&mut self, req: &Request, out: &mut Vec<u8>) {
        match req {
            Request::Get { kind, exptime, keys } => self.get(*kind, *exptime, keys, out),
            Request::Store { kind: StoreKind::Cas, .. } => self.cas(req, out),
            Request::Store { key, .. } => {
                self.facts.counters.cmd_set += 1;
                self.write_replicas(req, key, out);
            }
            Request::Delete { key, .. } => {
                self.write_replicas(req, key, out);
                let c = &mut self.facts.counters;
                count_outcome(out, b"DELETED", &mut c.delete_hits, &mut c.delete_misses);
            }
            Request::Touch { key, .. } => {
                self.facts.counters.cmd_touch += 1;
                self.write_replicas(req, key, out);
                let c = &mut self.facts.counters;
                count_outcome(out, b"TOUCHED", &mut c.touch_hits, &mut c.touch_misses);
            }
            Request::Arith { kind, key, .. } => {
                self.write_replicas(req, key, out);
                let c = &mut self.facts.counters;
                let (hits, misses) = match kind {
                    mcproto::ArithKind::Incr => (&mut c.incr_hits, &mut c.incr_misses),
                    mcproto::ArithKind::Decr => (&mut c.decr_hits, &mut c.decr_misses),
                };
                if out.first().is_some_and(u8::is_ascii_digit) {
                    *hits += 1;
                } else if out.starts_with(b"NOT_FOUND") {
                    *misses += 1;
                }
            }
            Request::FlushAll { .. } | Request::Verbosity { .. } => {
                if matches!(req, Request::FlushAll { .. }) {
                    self.facts.counters.cmd_flush += 1;
                }
                self.sendbuf.clear();
                req.encode(&mut self.sendbuf, false);
                let all: Vec<usize> = (0..self.backends.len()).collect();
                self.fan_out(&all, out);
            }
            Request::Version => {
                out.extend_from_slice(format!("VERSION {}\r\n", crate::VERSION).as_bytes());
            }
            Request::Stats { args } => self.stats_reply(args, out),
            Request::Quit => {}
            Request::Meta { kind, key, raw } => self.meta(*kind, key, raw, out),
        }
    }

    /// Meta commands. `mn` is answered here. The others are forwarded as the
    /// client sent them with an `mn` behind, and what the server answers before
    /// its `MN` is the reply: nothing where quiet mode holds an answer back, two
    /// replies for a refused line and its data. So every flag means what the
    /// server says it means, and replies never fall out of step. `mg` reads
    /// one replica (the read policy's, the next one on failure), `me` the
    /// primary; `ms`, `md` and `ma` go to every replica and are answered by the
    /// primary, unless a replica failed: a write is acknowledged only when every
    /// replica has it.
    fn meta(&mut self, kind: MetaKind, key: &[u8], raw: &[u8], out: &mut Vec<u8>) {
        if kind == MetaKind::Noop {
            out.extend_from_slice(b"MN\r\n");
            return;
        }
        let routing = &self.shared.config.routing;
        let mut replicas = self.shared.ring.replicas(key, routing.replication);
        if kind == MetaKind::Get && routing.read_policy == ReadPolicy::RoundRobin {
            let turn = self.rr % replicas.len();
            replicas.rotate_left(turn);
            self.rr = self.rr.wrapping_add(1);
        }
        self.sendbuf.clear();
        self.sendbuf.extend_from_slice(raw);
        self.sendbuf.extend_from_slice(b"mn\r\n");
        let start = out.len();
        if kind.writes() {
            self.meta_exchange(&replicas, true, out);
        } else {
            for (i, &s) in replicas.iter().enumerate() {
                if self.meta_exchange(&[s], i + 1 == replicas.len(), out) {
                    break;
                }
            }
        }
        let reply = &out[start..];
        let c = &mut self.facts.counters;
        // Quiet mode leaves the reply empty for an mg miss and an md success.
        match kind {
            MetaKind::Get => {
                c.cmd_get += 1;
                if reply.starts_with(b"VA ") || reply.starts_with(b"HD") {
                    c.get_hits += 1;
                } else if reply.is_empty() || reply.starts_with(b"EN") {
                    c.get_misses += 1;
                }
            }
            MetaKind::Set => c.cmd_set += 1,
            MetaKind::Delete => {
                if reply.is_empty() || reply.starts_with(b"HD") {
                    c.delete_hits += 1;
                } else if reply.starts_with(b"NF") {
                    c.delete_misses += 1;
                }
            }
            _ => {}
        }
    }

    /// Sends the meta command in the send buffer to `servers` at once. When all
    /// answer, appends the first one's reply (without the closing `MN`) and
    /// returns true; otherwise, if `last` (no other server to try), appends the
    /// `SERVER_ERROR` of the first that failed.
    fn meta_exchange(&mut self, servers: &[usize], last: bool, out: &mut Vec<u8>) -> bool {
        let range = 0..self.sendbuf.len();
        let mut targets: Vec<Target> = servers.iter().map(|&s| Target::meta(s, range.clone())).collect();
        self.exchange(&mut targets);
        let failed = targets.iter().find(|t| t.result.is_err());
        match failed {
            Some(t) => {
                self.facts.counters.backend_failures += 1;
                if last {
                    self.error_line(t.server, t.result.as_ref().unwrap_err(), out);
                }
            }
            None => {
                let reply = self.reply_of(&targets[0]).expect("answered");
                out.extend_from_slice(&reply[..reply.len() - b"MN\r\n".len()]);
            }
        }
        self.finish(&targets);
        failed.is_none()
    }

    fn write_replicas(&mut self, req: &Request, key: &[u8], out: &mut Vec<u8>) {
        self.sendbuf.clear();
        req.encode(&mut self.sendbuf, false);
        let servers = self.shared.ring.replicas(key, self.shared.config.routing.replication);
        self.fan_out(&servers, out);
    }

    fn cas(&mut self, req: &Request, out: &mut Vec<u8>) {
        let Request::Store { key, flags, exptime, data, .. } = req else { unreachable!() };
        self.facts.counters.cmd_set += 1;
        let replicas = self.shared.ring.replicas(key, self.shared.config.routing.replication);
        self.sendbuf.clear();
        req.encode(&mut self.sendbuf, false);
        let start = out.len();
        self.fan_out(&replicas[..1], out);
        let answer = &out[start..];
        let c = &mut self.facts.counters;
        if answer == b"EXISTS\r\n" {
            c.cas_badval += 1;
        } else if answer == b"NOT_FOUND\r\n" {
            c.cas_misses += 1;
        }
        if answer != b"STORED\r\n" {
            return;
        }
        c.cas_hits += 1;
        if replicas.len() > 1 {
            self.sendbuf.clear();
            let set = Request::Store {
                kind: StoreKind::Set,
                key: key.clone(),
                flags: *flags,
                exptime: *exptime,
                cas: 0,
                data: data.clone(),
                noreply: false,
            };
            set.encode(&mut self.sendbuf, false);
            let mut copies = Vec::new();
            self.fan_out(&replicas[1..], &mut copies);
            if copies != b"STORED\r\n" {
                self.facts.counters.replica_disagreements += 1;
            }
        }
    }

    /// For each key, the servers to try in order (`r` per key, flattened).
    fn read_candidates(&mut self, kind: GetKind, keys: &[Vec<u8>]) -> Vec<usize> {
        let routing = &self.shared.config.routing;
        let (n, r, k) = (self.backends.len(), routing.replication, keys.len());
        let rr = self.rr;
        self.rr = self.rr.wrapping_add(1);
        let mut cands = Vec::with_capacity(k * r);
        if r == n && kind == GetKind::Get && k > 1 {
            for i in 0..k {
                let first = match routing.multiget {
                    MultigetMode::Sharded => (rr + i * n / k) % n,
                    MultigetMode::NonSharded => rr % n,
                };
                cands.extend((0..r).map(|j| (first + j) % n));
            }
        } else {
            let start = if kind == GetKind::Get && routing.read_policy == ReadPolicy::RoundRobin { rr % r } else { 0 };
            let mut reps = Vec::with_capacity(r);
            for key in keys {
                self.shared.ring.replicas_into(key, r, &mut reps);
                cands.extend((0..r).map(|j| reps[(start + j) % r]));
            }
        }
        cands
    }

    fn get(&mut self, kind: GetKind, exptime: i32, keys: &[Vec<u8>], out: &mut Vec<u8>) {
        let start = out.len();
        self.read_keys(kind, exptime, keys, out);
        if kind.touches() && self.shared.config.routing.replication > 1 {
            self.touch_other_replicas(exptime, start, out);
        }
    }

    /// gat/gats read one replica; the keys they found get the new expiry time on
    /// the other replicas too (noreply touches, not waited for), so replicas
    /// keep the same lifetime.
    fn touch_other_replicas(&mut self, exptime: i32, start: usize, out: &[u8]) {
        let Ok(Some((Response::Values(values), _))) = mcproto::parse_response(&out[start..]) else {
            return;
        };
        let r = self.shared.config.routing.replication;
        let mut batches: Vec<Vec<u8>> = vec![Vec::new(); self.backends.len()];
        let mut replicas = Vec::with_capacity(r);
        for v in &values {
            self.shared.ring.replicas_into(v.key, r, &mut replicas);
            for &s in &replicas[1..] {
                let b = &mut batches[s];
                b.extend_from_slice(b"touch ");
                b.extend_from_slice(v.key);
                b.extend_from_slice(format!(" {exptime} noreply\r\n").as_bytes());
            }
        }
        for (s, batch) in batches.iter().enumerate() {
            if !batch.is_empty() {
                self.send_without_reply(s, batch);
            }
        }
    }

    fn read_keys(&mut self, kind: GetKind, exptime: i32, keys: &[Vec<u8>], out: &mut Vec<u8>) {
        let k = keys.len();
        if k == 0 {
            out.extend_from_slice(b"END\r\n");
            return;
        }
        let r = self.shared.config.routing.replication;
        let cands = self.read_candidates(kind, keys);
        // Values found, encoded into `arena`, by key position.
        let mut spans: Vec<Option<Range<usize>>> = vec![None; k];
        let mut arena = Vec::new();
        let mut todo: Vec<usize> = (0..k).collect();
        let mut first_error: Option<Vec<u8>> = None;
        let mut unanswered = 0;
        let mut answered = false;
        let mut failovers = 0u64;
        for round in 0..r {
            if todo.is_empty() {
                break;
            }
            let groups = group_by_server(&todo, |i| cands[i * r + round]);
            self.sendbuf.clear();
            let mut targets = Vec::with_capacity(groups.len());
            for (server, idx) in &groups {
                let start = self.sendbuf.len();
                encode_get(&mut self.sendbuf, kind, exptime, idx.iter().map(|&i| keys[i].as_slice()));
                targets.push(Target::new(*server, start..self.sendbuf.len()));
            }
            self.exchange(&mut targets);
            if round == 0 && targets.len() == 1 && targets[0].result.is_ok() {
                // One server answered for all keys: its reply is the client's reply.
                let raw = self.reply_of(&targets[0]).expect("ok target");
                let hits = match parsed(raw) {
                    Response::Values(v) => Some(v.len() as u64),
                    _ => None,
                };
                out.extend_from_slice(raw);
                self.finish(&targets);
                if let Some(h) = hits {
                    self.count_gets(kind, k as u64, h);
                }
                return;
            }
            let mut next = Vec::new();
            for ((_, idx), t) in groups.iter().zip(&targets) {
                match self.reply_of(t).map(parsed) {
                    Some(Response::Values(vals)) => {
                        answered = true;
                        if round > 0 {
                            failovers += 1;
                        }
                        let mut cursor = 0;
                        for &i in idx {
                            if cursor < vals.len() && vals[cursor].key == keys[i].as_slice() {
                                let s = arena.len();
                                encode_value(&mut arena, &vals[cursor]);
                                spans[i] = Some(s..arena.len());
                                cursor += 1;
                            }
                        }
                    }
                    Some(_) => {
                        let raw = self.reply_of(t).expect("answered");
                        first_error.get_or_insert_with(|| raw.to_vec());
                        unanswered += idx.len();
                    }
                    None => {
                        if first_error.is_none() {
                            let mut line = Vec::new();
                            self.error_line(t.server, t.result.as_ref().unwrap_err(), &mut line);
                            first_error = Some(line);
                        }
                        next.extend_from_slice(idx);
                    }
                }
            }
            self.finish(&targets);
            todo = next;
        }
        self.facts.counters.read_failovers += failovers;
        if unanswered + todo.len() > 0 {
            let fail_all = self.shared.config.routing.multiget_failure == MultigetFailure::Fail;
            if !answered || k == 1 || fail_all {
                self.facts.counters.backend_failures += 1;
                out.extend_from_slice(&first_error.unwrap_or_default());
                return;
            }
            self.facts.counters.multiget_partial += 1;
        }
        let mut hits = 0;
        for span in spans.into_iter().flatten() {
            out.extend_from_slice(&arena[span]);
            hits += 1;
        }
        out.extend_from_slice(b"END\r\n");
        self.count_gets(kind, k as u64, hits);
    }

    fn count_gets(&mut self, kind: GetKind, keys: u64, hits: u64) {
        self.facts.hits = hits;
        let c = &mut self.facts.counters;
        if kind.touches() {
            c.cmd_touch += keys;
            c.touch_hits += hits;
            c.touch_misses += keys.saturating_sub(hits);
        } else {
            c.cmd_get += keys;
            c.get_hits += hits;
            c.get_misses += keys.saturating_sub(hits);
        }
    }

    fn stats_reply(&self, args: &[Vec<u8>], out: &mut Vec<u8>) {
        let mut stat = |name: &str, value: &dyn std::fmt::Display| {
            out.extend_from_slice(format!("STAT {name} {value}\r\n").as_bytes());
        };
        match args.first().map(Vec::as_slice) {
            None => {
                for (name, value) in crate::server::general_stats(&self.shared) {
                    stat(&name, &value);
                }
            }
            Some(b"backends") if args.len() == 1 => {
                let now_ms = self.shared.started.elapsed().as_millis() as u64;
                let acc = self.shared.telemetry.everything();
                for (i, spec) in self.shared.config.routing.servers.iter().enumerate() {
                    let up = self.shared.health[i].is_up(now_ms) && !self.shared.health[i].failing();
                    let b = &acc.backends[i];
                    stat(&format!("backend:{i}:address"), &spec.endpoint());
                    stat(&format!("backend:{i}:weight"), &spec.weight);
                    stat(&format!("backend:{i}:status"), &if up { "up" } else { "down" });
                    stat(&format!("backend:{i}:requests"), &b.requests);
                    stat(&format!("backend:{i}:errors"), &b.errors);
                    stat(&format!("backend:{i}:timeouts"), &b.timeouts);
                    stat(&format!("backend:{i}:reconnects"), &b.reconnects);
                    stat(&format!("backend:{i}:server_us_mean"), &format!("{:.1}", b.server.mean()));
                    stat(&format!("backend:{i}:server_us_p99"), &b.server.quantile(0.99));
                }
            }
            Some(b"settings") if args.len() == 1 => {
                for line in self.shared.config.to_toml().lines() {
                    if let Some((k, v)) = line.split_once(" = ") {
                        stat(k.trim(), &v.trim().trim_matches('"'));
                    }
                }
            }
            Some(b"reset") if args.len() == 1 => {
                self.shared.telemetry.reset_counters(&self.shared.net);
                out.extend_from_slice(b"RESET\r\n");
                return;
            }
            _ => {
                out.extend_from_slice(b"ERROR\r\n");
                return;
            }
        }
        out.extend_from_slice(b"END\r\n");
    }
}

/// Groups key positions by the server `pick` assigns, keeping each group in
/// the client's order and the groups in order of first appearance.
fn group_by_server(todo: &[usize], pick: impl Fn(usize) -> usize) -> Vec<(usize, Vec<usize>)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for &i in todo {
        let s = pick(i);
        match groups.iter_mut().find(|(server, _)| *server == s) {
            Some((_, g)) => g.push(i),
            None => groups.push((s, vec![i])),
        }
    }
    groups
}

fn count_outcome(reply: &[u8], hit: &[u8], hits: &mut u64, misses: &mut u64) {
    if reply.starts_with(hit) {
        *hits += 1;
    } else if reply.starts_with(b"NOT_FOUND") {
        *misses += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::group_by_server;

    #[test]
    fn groups_keep_client_order() {
        let g = group_by_server(&[0, 1, 2, 3, 4], |i| [2, 0, 2, 1, 0][i]);
        assert_eq!(g, vec![(2, vec![0, 2]), (0, vec![1, 4]), (1, vec![3])]);
    }
}
