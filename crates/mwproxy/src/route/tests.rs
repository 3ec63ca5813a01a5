//! The routing core on its own: requests driven round by round against
//! scripted server answers, no sockets.

use std::collections::HashMap;

use mcproto::{parse_request, Limits, Parsed, Request};

use super::*;
use crate::config::Config;

fn router(servers: usize, replication: usize, tweak: impl FnOnce(&mut Config)) -> Router {
    let mut c = Config::default();
    c.routing.servers = (0..servers).map(|i| format!("127.0.0.1:{}", 20000 + i).parse().unwrap()).collect();
    c.routing.replication = replication;
    tweak(&mut c);
    let addrs: Vec<mwserve::stream::Addr> =
        (0..servers).map(|i| mwserve::stream::Addr::Tcp(format!("127.0.0.1:{}", 20000 + i).parse().unwrap())).collect();
    Router::new(&c, &addrs)
}

fn request(text: &str) -> Work {
    match parse_request(text.as_bytes(), &Limits::default()) {
        Parsed::Request { request, .. } => Work::Request(request),
        other => panic!("{text:?} did not parse: {other:?}"),
    }
}

/// What each round sent: (server, bytes).
type Log = Vec<Vec<(usize, String)>>;

/// Runs `work` to the end; `answer` gives each server's reply to the bytes it got.
fn drive(
    router: &Router,
    work: Work,
    answer: impl FnMut(usize, &str) -> Result<String, BackendError>,
) -> (String, Effects, Log) {
    drive_in_order(router, work, answer, false)
}

/// [`drive`], with each round's replies absorbed last call first when `reversed`.
fn drive_in_order(
    router: &Router,
    work: Work,
    mut answer: impl FnMut(usize, &str) -> Result<String, BackendError>,
    reversed: bool,
) -> (String, Effects, Log) {
    let mut rr = 0;
    let Begin::Exec(mut exec) = Exec::begin(work, router, &mut rr) else { panic!("answered locally") };
    let mut out = Outbox::new(router.servers());
    let mut log = Log::new();
    loop {
        out.clear();
        let n = exec.round(router, &mut out);
        if n == 0 {
            break;
        }
        let calls = out.calls().to_vec();
        let mut sent: Vec<(usize, String)> = Vec::new();
        let mut replies = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            let bytes = String::from_utf8_lossy(out.bytes(call.server)).into_owned();
            assert!(calls.iter().filter(|c| c.server == call.server).count() == 1, "one call per server and round");
            sent.push((call.server, bytes.clone()));
            if call.reply {
                replies.push((i, answer(call.server, &bytes)));
            }
        }
        if reversed {
            replies.reverse();
        }
        for (i, reply) in &replies {
            match reply {
                Ok(r) => exec.absorb(router, *i, Ok(r.as_bytes())),
                Err(e) => exec.absorb(router, *i, Err(e)),
            }
        }
        log.push(sent);
    }
    (String::from_utf8_lossy(&exec.reply).into_owned(), exec.effects, log)
}

/// A server holding `items`, answering gets (in the order asked) and sets.
fn holding<'a>(
    items: &'a HashMap<(usize, &str), &str>,
) -> impl FnMut(usize, &str) -> Result<String, BackendError> + 'a {
    move |server, req| {
        let words: Vec<&str> = req.split_whitespace().collect();
        Ok(match words[0] {
            "get" | "gets" => {
                let mut r = String::new();
                for k in &words[1..] {
                    if let Some(v) = items.get(&(server, *k)) {
                        r.push_str(&format!("VALUE {k} 0 {}\r\n{v}\r\n", v.len()));
                    }
                }
                r + "END\r\n"
            }
            _ => "STORED\r\n".into(),
        })
    }
}

#[test]
fn a_multiget_is_split_by_server_and_merged_in_the_clients_order() {
    let r = router(3, 1, |_| {});
    let keys = ["a", "b", "c", "d", "e", "f", "g"];
    let mut items = HashMap::new();
    for k in &keys[..6] {
        items.insert((r.ring.server_for(k.as_bytes()), *k), *k);
    }
    let (reply, fx, log) = drive(&r, request("get a b c d e f g\r\n"), holding(&items));
    let expected: String =
        keys[..6].iter().map(|k| format!("VALUE {k} 0 1\r\n{k}\r\n")).collect::<String>() + "END\r\n";
    assert_eq!(reply, expected);
    assert_eq!(log.len(), 1, "one round");
    assert!(log[0].len() > 1, "spread over servers: {log:?}");
    assert_eq!((fx.hits, fx.counters.cmd_get, fx.counters.get_misses), (6, 7, 1));
}

#[test]
fn a_failed_servers_keys_are_read_from_the_next_replica() {
    let r = router(3, 2, |c| c.routing.read_policy = ReadPolicy::Primary);
    let key = "k1";
    let reps = r.replicas(key.as_bytes());
    let mut items = HashMap::new();
    items.insert((reps[1], key), "v");
    let mut inner = holding(&items);
    let (reply, fx, log) =
        drive(
            &r,
            request("get k1\r\n"),
            |s, req| {
                if s == reps[0] {
                    Err(BackendError::Timeout)
                } else {
                    inner(s, req)
                }
            },
        );
    assert_eq!(reply, "VALUE k1 0 1\r\nv\r\nEND\r\n");
    assert_eq!(log.iter().map(|round| round[0].0).collect::<Vec<_>>(), vec![reps[0], reps[1]]);
    assert_eq!(fx.counters.read_failovers, 1);
}

#[test]
fn keys_no_replica_answers_are_left_out_or_fail_the_request() {
    let failing = |r: &Router| r.ring.server_for(b"x");
    for (policy, fails) in [(MultigetFailure::Partial, false), (MultigetFailure::Fail, true)] {
        let r = router(3, 1, |c| c.routing.multiget_failure = policy);
        let keys: Vec<String> = (0..20).map(|i| format!("x{i}")).collect();
        let dead = failing(&r);
        let (reply, fx, _) = drive(&r, request(&format!("get x {}\r\n", keys.join(" "))), |s, req| {
            if s == dead {
                return Err(BackendError::Down);
            }
            let words: Vec<&str> = req.split_whitespace().skip(1).collect();
            Ok(words.iter().map(|k| format!("VALUE {k} 0 1\r\n1\r\n")).collect::<String>() + "END\r\n")
        });
        if fails {
            assert_eq!(reply, format!("SERVER_ERROR backend {} unavailable\r\n", r.addrs[dead]));
            assert_eq!(fx.counters.backend_failures, 1);
        } else {
            assert!(reply.ends_with("END\r\n") && !reply.contains("VALUE x "), "{reply}");
            assert_eq!(fx.counters.multiget_partial, 1);
        }
    }
    // A single key always fails.
    let r = router(1, 1, |_| {});
    let (reply, _, _) = drive(&r, request("get k\r\n"), |_, _| Err(BackendError::Stalled));
    assert_eq!(reply, format!("SERVER_ERROR backend {} stalled\r\n", r.addrs[0]));
}

#[test]
fn with_miss_failover_a_miss_is_looked_up_on_the_next_replica() {
    let r = router(2, 2, |c| {
        c.routing.miss_failover = true;
        c.routing.read_policy = ReadPolicy::Primary;
    });
    let reps = r.replicas(b"k");
    let mut items = HashMap::new();
    items.insert((reps[1], "k"), "v");
    let (reply, fx, log) = drive(&r, request("get k\r\n"), holding(&items));
    assert_eq!(reply, "VALUE k 0 1\r\nv\r\nEND\r\n");
    assert_eq!(log.len(), 2);
    assert_eq!(fx.hits, 1);
    let r = router(2, 2, |c| c.routing.read_policy = ReadPolicy::Primary);
    let (reply, _, log) = drive(&r, request("get k\r\n"), holding(&items));
    assert_eq!((reply.as_str(), log.len()), ("END\r\n", 1), "without it a miss is a miss");
}

#[test]
fn a_retrieval_too_large_for_memory_is_refused() {
    let r = router(2, 1, |c| {
        c.limits.max_value_size = 100;
        c.limits.max_reply_size = 150;
    });
    let keys: Vec<String> = (0..10).map(|i| format!("big{i}")).collect();
    let (reply, _, _) = drive(&r, request(&format!("get {}\r\n", keys.join(" "))), |_, req| {
        let words: Vec<&str> = req.split_whitespace().skip(1).collect();
        Ok(words.iter().map(|k| format!("VALUE {k} 0 60\r\n{}\r\n", "z".repeat(60))).collect::<String>() + "END\r\n")
    });
    assert_eq!(reply.as_bytes(), REPLY_TOO_LARGE);
}

#[test]
fn a_write_left_different_on_its_replicas_is_repaired() {
    let r = router(3, 2, |_| {});
    let reps = r.replicas(b"w");
    let (reply, fx, log) = drive(&r, request("set w 0 0 1\r\nv\r\n"), |_, _| Ok("STORED\r\n".into()));
    assert_eq!(reply, "STORED\r\n");
    assert_eq!(log[0].iter().map(|c| c.0).collect::<Vec<_>>(), reps, "to every replica at once");
    assert!(fx.repairs.is_empty());
    // One replica fails: not acknowledged, and both are repaired (one may
    // hold the new value, the other the old one).
    let fail_second =
        |s: usize, _: &str| if s == reps[1] { Err(BackendError::Timeout) } else { Ok("STORED\r\n".into()) };
    let (reply, fx, _) = drive(&r, request("set w 0 0 1\r\nv\r\n"), fail_second);
    assert_eq!(reply, format!("SERVER_ERROR backend {} timeout\r\n", r.addrs[reps[1]]));
    let mut repaired: Vec<usize> = fx.repairs.iter().map(|(s, _)| *s).collect();
    repaired.sort();
    let mut all = reps.clone();
    all.sort();
    assert_eq!(repaired, all);
    assert_eq!(fx.counters.replica_write_failures, 1);
    // With a quorum of one it is acknowledged, and only the failed one is repaired.
    let r1 = router(3, 2, |c| c.routing.write_quorum = 1);
    let (reply, fx, _) = drive(&r1, request("set w 0 0 1\r\nv\r\n"), fail_second);
    assert_eq!(reply, "STORED\r\n");
    assert_eq!(fx.repairs, vec![(reps[1], b"w".to_vec())]);
    // Replicas that answer differently are all repaired.
    let (reply, fx, _) = drive(&r, request("add w 0 0 1\r\nv\r\n"), |s, _| {
        Ok(if s == reps[0] { "STORED\r\n" } else { "NOT_STORED\r\n" }.into())
    });
    assert_eq!(reply, "NOT_STORED\r\n");
    assert_eq!(fx.repairs.len(), 2);
    assert_eq!(fx.counters.replica_disagreements, 1);
    // A delete that one replica did not have leaves nothing to repair.
    let (reply, fx, _) =
        drive(
            &r,
            request("delete w\r\n"),
            |s, _| Ok(if s == reps[0] { "DELETED\r\n" } else { "NOT_FOUND\r\n" }.into()),
        );
    assert_eq!(reply, "NOT_FOUND\r\n");
    assert!(fx.repairs.is_empty());
}

#[test]
fn cas_is_decided_by_the_primary_and_copied_to_the_others() {
    let r = router(3, 3, |_| {});
    let reps = r.replicas(b"c");
    let (reply, fx, log) = drive(&r, request("cas c 0 0 1 7\r\nv\r\n"), |s, _| {
        if s == reps[2] {
            Err(BackendError::Down)
        } else {
            Ok("STORED\r\n".into())
        }
    });
    assert_eq!(reply, "STORED\r\n");
    assert_eq!(log.len(), 2);
    assert_eq!(log[0], vec![(reps[0], "cas c 0 0 1 7\r\nv\r\n".to_string())]);
    assert_eq!(log[1].iter().map(|c| c.0).collect::<Vec<_>>(), vec![reps[1], reps[2]]);
    assert!(log[1][0].1.starts_with("set c 0 0 1\r\n"));
    assert_eq!(fx.repairs, vec![(reps[2], b"c".to_vec())], "the copy that failed is repaired");
    assert_eq!(fx.counters.cas_hits, 1);
}

#[test]
fn gat_touches_the_other_replicas_without_waiting() {
    let r = router(2, 2, |_| {});
    let reps = r.replicas(b"t");
    let (reply, _, log) = drive(&r, request("gat 60 t\r\n"), |s, _| {
        assert_eq!(s, reps[0], "gat reads the primary");
        Ok("VALUE t 0 1\r\nv\r\nEND\r\n".into())
    });
    assert_eq!(reply, "VALUE t 0 1\r\nv\r\nEND\r\n");
    assert_eq!(log[1], vec![(reps[1], "touch t 60 noreply\r\n".to_string())]);
}

#[test]
fn meta_reads_fail_over_and_meta_writes_go_to_every_replica() {
    let r = router(2, 2, |c| c.routing.read_policy = ReadPolicy::Primary);
    let reps = r.replicas(b"m");
    let (reply, _, log) = drive(&r, request("mg m v\r\n"), |s, req| {
        assert!(req.ends_with("mn\r\n"), "{req:?}");
        if s == reps[0] {
            Err(BackendError::Down)
        } else {
            Ok("VA 1\r\nv\r\nMN\r\n".into())
        }
    });
    assert_eq!(reply, "VA 1\r\nv\r\n");
    assert_eq!(log.len(), 2);
    let (reply, _, log) = drive(&r, request("ms m 1 T0\r\nv\r\n"), |_, _| Ok("HD\r\nMN\r\n".into()));
    assert_eq!(reply, "HD\r\n");
    assert_eq!(log[0].len(), 2);
    let local = Exec::begin(request("stats settings\r\n"), &r, &mut 0);
    assert!(matches!(local, Begin::Local(Request::Stats { .. })));
}

#[test]
fn meta_commands_with_cas_lease_touch_or_invalidation_are_decided_by_the_primary() {
    let r = router(3, 3, |_| {});
    let reps = r.replicas(b"p");
    // A cas compare: the primary decides, the others get the value without the condition.
    let (reply, fx, log) = drive(&r, request("ms p 2 C77 T60\r\nhi\r\n"), |_, _| Ok("HD\r\nMN\r\n".into()));
    assert_eq!(reply, "HD\r\n");
    assert_eq!(log[0], vec![(reps[0], "ms p 2 C77 T60\r\nhi\r\nmn\r\n".to_string())]);
    assert_eq!(log[1].iter().map(|c| c.1.as_str()).collect::<Vec<_>>(), vec!["ms p 2 T60\r\nhi\r\nmn\r\n"; 2]);
    assert!(fx.repairs.is_empty());
    // A mismatch changes nothing anywhere.
    let (reply, _, log) = drive(&r, request("ms p 2 C78\r\nhi\r\n"), |_, _| Ok("EX\r\nMN\r\n".into()));
    assert_eq!((reply.as_str(), log.len()), ("EX\r\n", 1));
    // Invalidation marks the primary's item stale and deletes the others'.
    let (_, _, log) = drive(&r, request("md p I T30\r\n"), |_, _| Ok("HD\r\nMN\r\n".into()));
    assert_eq!(log[1].iter().map(|c| c.1.as_str()).collect::<Vec<_>>(), vec!["md p\r\nmn\r\n"; 2]);
    // A cas token, a lease or a touch is read from the primary only; a touch is copied.
    for (cmd, rounds) in [("mg p v c\r\n", 1), ("mg p v N30\r\n", 1), ("mg p v T90\r\n", 2)] {
        let (_, _, log) = drive(&r, request(cmd), |_, _| Ok("VA 2 W\r\nhi\r\nMN\r\n".into()));
        assert_eq!(log[0], vec![(reps[0], format!("{cmd}mn\r\n"))], "{cmd}");
        assert_eq!(log.len(), rounds, "{cmd}");
    }
    // A plain read still uses the read policy.
    let mut seen = std::collections::HashSet::new();
    let mut rr = 0;
    for _ in 0..6 {
        let Begin::Exec(mut e) = Exec::begin(request("mg p v\r\n"), &r, &mut rr) else { panic!() };
        let mut out = Outbox::new(3);
        e.round(&r, &mut out);
        seen.insert(out.calls()[0].server);
    }
    assert_eq!(seen.len(), 3);
}

#[test]
fn replies_may_end_their_calls_in_any_order() {
    // Multi-gets over several servers (some failing, some refusing), replicated
    // writes with failures and disagreements, broadcasts: the same reply and
    // effects whichever call's reply comes first.
    let r3 = router(3, 1, |_| {});
    let r2 = router(3, 2, |_| {});
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    let mget = format!("get {}\r\n", keys.join(" "));
    let cases: Vec<(&Router, String)> = vec![
        (&r3, mget.clone()),
        (&r2, mget),
        (&r2, "set k1 0 0 1\r\nv\r\n".into()),
        (&r2, "add k2 0 0 1\r\nv\r\n".into()),
        (&r3, "flush_all\r\n".into()),
        (&r2, "ms k3 1 T5\r\nv\r\n".into()),
    ];
    let answer = |s: usize, req: &str| -> Result<String, BackendError> {
        let words: Vec<&str> = req.split_whitespace().collect();
        match (s, words[0]) {
            (0, _) => Err(BackendError::Timeout),
            (1, "get") => Ok("SERVER_ERROR busy\r\n".into()),
            (_, "get") => {
                Ok(words[1..].iter().map(|k| format!("VALUE {k} 0 1\r\n{s}\r\n")).collect::<String>() + "END\r\n")
            }
            (1, "add") => Ok("NOT_STORED\r\n".into()),
            (_, "ms") => Ok("HD\r\nMN\r\n".into()),
            (_, "flush_all") => Ok("OK\r\n".into()),
            _ => Ok("STORED\r\n".into()),
        }
    };
    for (router, text) in cases {
        let (a, fa, la) = drive_in_order(router, request(&text), answer, false);
        let (b, fb, lb) = drive_in_order(router, request(&text), answer, true);
        assert_eq!(a, b, "{text:?}");
        assert_eq!(format!("{fa:?}"), format!("{fb:?}"), "{text:?}");
        assert_eq!(la, lb, "{text:?}: the same rounds");
    }
}
