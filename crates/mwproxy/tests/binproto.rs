//! memcached's binary protocol through mwproxy: a differential test of
//! random sequences (quiet pipelines closed by a noop, cas taken from earlier
//! replies or made up, increments that create their item, keys that are no
//! text token) sent to a memcached directly and to mwproxy in front of one
//! server, three servers, and three servers with two replicas — the
//! responses the same frame for frame, cas uniques compared as "zero or
//! not" (they differ between servers); the refusals and closes memcached
//! makes; SASL PLAIN logins against `--auth-file`; a server that is down.
//!
//! `BINARY_SEED` and `BINARY_STEPS` repeat or lengthen a run.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use mcproto::binary::{encode_request, op, status, Frame};
use mctest::{Memcached, Rng};
use mwproxy::Service;

/// Which cas a request carries: none, the one the key's last reply gave
/// (each side its own), or one that cannot match.
#[derive(Clone, Copy, Debug)]
enum Cas {
    None,
    Fresh,
    Wrong,
}

/// One request, before its cas is resolved on a side.
#[derive(Clone, Debug)]
struct Op {
    opcode: u8,
    key: Vec<u8>,
    extras: Vec<u8>,
    value: Vec<u8>,
    cas: Cas,
}

const KEYS: &[&[u8]] = &[b"k0", b"k1", b"k2", b"k3", b"num", b"a key with spaces", b"\x01bin\xff", b"k5"];

fn random_op(rng: &mut Rng) -> Op {
    let key = rng.pick(KEYS).to_vec();
    let value: Vec<u8> = match rng.below(5) {
        0 => rng.below(1000).to_string().into_bytes(),
        1 => Vec::new(),
        2 => b"line\r\nbreak".to_vec(),
        _ => (0..rng.below(300)).map(|i| b'a' + (i % 26) as u8).collect(),
    };
    let exptime = *rng.pick(&[0u32, 0, 1000, 100_000]);
    let flags = *rng.pick(&[0u32, 1, 0xdead_beef]);
    let cas = *rng.pick(&[Cas::None, Cas::None, Cas::None, Cas::Fresh, Cas::Wrong]);
    let store = |opcode| Op {
        opcode,
        key: key.clone(),
        extras: [flags.to_be_bytes(), exptime.to_be_bytes()].concat(),
        value: value.clone(),
        cas,
    };
    let bare = |opcode, cas| Op { opcode, key: key.clone(), extras: Vec::new(), value: Vec::new(), cas };
    match rng.below(26) {
        0..=3 => bare(*rng.pick(&[op::GET, op::GETQ, op::GETK, op::GETKQ]), Cas::None),
        4..=6 => store(op::SET),
        7 => store(op::SETQ),
        8 => store(*rng.pick(&[op::ADD, op::ADDQ])),
        9 => store(*rng.pick(&[op::REPLACE, op::REPLACEQ])),
        // Never onto "num", the one key decremented: a decrement may leave
        // spaces after the number (see `unpadded`), and an append would keep them.
        10 | 11 if key != b"num" => {
            Op { extras: Vec::new(), ..store(*rng.pick(&[op::APPEND, op::PREPEND, op::APPENDQ, op::PREPENDQ])) }
        }
        12 | 13 => bare(*rng.pick(&[op::DELETE, op::DELETEQ]), cas),
        14..=17 => {
            // (No wrap past 2^64: with it, whether memcached pads a shortened
            // number in place decides later answers; see `unpadded`.)
            let delta = *rng.pick(&[0u64, 1, 7, 1000]);
            let initial = *rng.pick(&[0u64, 5, 100]);
            let exp = *rng.pick(&[0u32, 1000, u32::MAX]);
            let opcode = *rng.pick(&[op::INCREMENT, op::DECREMENT, op::INCREMENTQ, op::DECREMENTQ]);
            let extras = [delta.to_be_bytes().as_slice(), &initial.to_be_bytes(), &exp.to_be_bytes()].concat();
            let decrement = matches!(opcode, op::DECREMENT | op::DECREMENTQ);
            let key = if decrement || rng.below(2) == 0 { b"num".to_vec() } else { key };
            Op { opcode, key, extras, value: Vec::new(), cas }
        }
        18 | 19 => Op {
            extras: exptime.to_be_bytes().to_vec(),
            ..bare(*rng.pick(&[op::TOUCH, op::GAT, op::GATQ, op::GATK, op::GATKQ]), Cas::None)
        },
        20 => Op { opcode: op::NOOP, key: Vec::new(), extras: Vec::new(), value: Vec::new(), cas: Cas::None },
        21 if rng.below(8) == 0 => Op {
            opcode: *rng.pick(&[op::FLUSH, op::FLUSHQ]),
            key: Vec::new(),
            extras: Vec::new(),
            value: Vec::new(),
            cas: Cas::None,
        },
        // (Without a key: memcached skips an unknown command's key twice.)
        22 => Op { opcode: 0x42, key: Vec::new(), extras: Vec::new(), value: b"body".to_vec(), cas: Cas::None },
        _ => bare(op::GET, Cas::None),
    }
}

/// A connection to one side, with the cas uniques its replies gave per key.
struct Side {
    stream: TcpStream,
    cas: HashMap<Vec<u8>, u64>,
    buf: Vec<u8>,
}

/// A response as read: opcode, status, opaque, cas, extras, key, value.
type Raw = (u8, u16, u32, u64, Vec<u8>, Vec<u8>, Vec<u8>);

/// A response as compared: every field, the cas as "zero or not".
type Seen = (u8, u16, u32, bool, Vec<u8>, Vec<u8>, Vec<u8>);

impl Side {
    fn connect(addr: SocketAddr) -> Side {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Side { stream, cas: HashMap::new(), buf: Vec::new() }
    }

    /// Sends a pipeline (closed by a noop with opaque `end`) and reads every
    /// response up to the noop's.
    fn run(&mut self, ops: &[(u32, Op)], end: u32) -> Vec<Seen> {
        let mut out = Vec::new();
        let mut keys = HashMap::new();
        for (opaque, o) in ops {
            let cas = match o.cas {
                Cas::None => 0,
                // (Unknown: one no server has handed out yet, on either side.)
                Cas::Fresh => self.cas.get(&o.key).copied().unwrap_or(0x7fff_ffff_fff0),
                Cas::Wrong => 0x7fff_ffff_ffff,
            };
            keys.insert(*opaque, o.key.clone());
            encode_request(&mut out, o.opcode, *opaque, cas, &o.extras, &o.key, &o.value);
        }
        encode_request(&mut out, op::NOOP, end, 0, &[], &[], &[]);
        self.stream.write_all(&out).unwrap();
        let mut seen = Vec::new();
        loop {
            let frames = self.take_frames();
            for f in frames {
                let (opcode, st, opaque, cas, extras, key, value) = f;
                if st == status::SUCCESS && cas != 0 {
                    if let Some(k) = keys.get(&opaque) {
                        self.cas.insert(k.clone(), cas);
                    }
                }
                let done = opcode == op::NOOP && opaque == end;
                seen.push((opcode, st, opaque, cas != 0, extras, key, unpadded(value)));
                if done {
                    return seen;
                }
            }
            let mut chunk = [0u8; 65536];
            let n = self.stream.read(&mut chunk).expect("a reply before the timeout");
            assert!(
                n > 0,
                "connection to {:?} closed before the noop's reply to {ops:?}; got {seen:?}",
                self.stream.peer_addr()
            );
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn take_frames(&mut self) -> Vec<Raw> {
        let mut frames = Vec::new();
        let mut at = 0;
        while let Some((f, n)) = Frame::read(&self.buf[at..]) {
            assert_eq!(self.buf[at], 0x81, "response magic");
            frames.push((f.opcode, f.status, f.opaque, f.cas, f.extras.to_vec(), f.key.to_vec(), f.value.to_vec()));
            at += n;
        }
        self.buf.drain(..at);
        frames
    }
}

/// A value without spaces. The values sent have none, but a decrement that
/// shortens a number may leave spaces after it: memcached pads when it can
/// rewrite the item in place, which depends on who else holds the item at
/// that moment (it differs between its binary and meta paths, and from run to
/// run), and appends carry them on. The numbers and the rest are the same.
fn unpadded(mut value: Vec<u8>) -> Vec<u8> {
    value.retain(|&b| b != b' ');
    value
}

/// A response for a failure message: the value cut short.
fn shown(r: &Seen) -> String {
    let v = String::from_utf8_lossy(&r.6[..r.6.len().min(40)]).into_owned();
    format!(
        "op {:#x} status {:#x} opaque {} cas {} extras {:?} key {:?} value {v:?} ({} bytes)",
        r.0,
        r.1,
        r.2,
        r.3,
        r.4,
        String::from_utf8_lossy(&r.5),
        r.6.len()
    )
}

fn seed() -> u64 {
    std::env::var("BINARY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_b1a5)
}

fn steps() -> usize {
    std::env::var("BINARY_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(300)
}

fn differential(n_servers: usize, replication: usize) {
    let direct = Memcached::start().unwrap();
    let servers = common::servers(n_servers);
    let proxy = common::proxy(&servers, |c| c.routing.replication = replication);
    let mut a = Side::connect(direct.addr());
    let mut b = Side::connect(proxy.local_addr());
    let seed = seed();
    let mut rng = Rng(seed | 1);
    let mut opaque = 1u32;
    let mut statuses = HashMap::new();
    let mut quiet_pipelines = 0;
    for step in 0..steps() {
        // A pipeline of 1 to 12 requests, mostly quiet ones at times.
        let long = rng.below(3) == 0;
        let n = 1 + rng.below(if long { 12 } else { 2 }) as usize;
        let ops: Vec<(u32, Op)> = (0..n)
            .map(|_| {
                opaque += 1;
                (opaque, random_op(&mut rng))
            })
            .collect();
        if n > 4 {
            quiet_pipelines += 1;
        }
        opaque += 1;
        let expected = a.run(&ops, opaque);
        let got = b.run(&ops, opaque);
        if std::env::var("BINARY_TRACE").is_ok() && ops.iter().any(|(_, o)| o.key == b"num") {
            eprintln!(
                "step {step}: {:?}",
                ops.iter()
                    .map(|(q, o)| (
                        *q,
                        o.opcode,
                        String::from_utf8_lossy(&o.key).into_owned(),
                        String::from_utf8_lossy(&o.value).into_owned(),
                        o.extras.clone(),
                        o.cas
                    ))
                    .collect::<Vec<_>>()
            );
            eprintln!("    -> {:?}", expected.iter().map(shown).collect::<Vec<_>>());
        }
        if got != expected {
            let at = got.iter().zip(&expected).position(|(g, e)| g != e).unwrap_or(got.len().min(expected.len()));
            panic!(
                "step {step} (seed {seed}, {n_servers} servers, R={replication}), response {at}: mwproxy {:?}, memcached {:?}; requests {:?}",
                got.get(at).map(shown),
                expected.get(at).map(shown),
                ops.iter()
                    .map(|(q, o)| (*q, o.opcode, String::from_utf8_lossy(&o.key).into_owned(), o.cas))
                    .collect::<Vec<_>>()
            );
        }
        for r in &expected {
            *statuses.entry(r.1).or_insert(0) += 1;
        }
    }
    // The sequences really reached the interesting answers.
    for s in [
        status::SUCCESS,
        status::KEY_ENOENT,
        status::KEY_EEXISTS,
        status::NOT_STORED,
        status::DELTA_BADVAL,
        status::UNKNOWN_COMMAND,
    ] {
        assert!(statuses.get(&s).copied().unwrap_or(0) > 0, "status {s:#x} never seen: {statuses:?}");
    }
    assert!(quiet_pipelines > 10);
    common::stop(proxy);
}

#[test]
fn binary_replies_match_memcached_with_one_server() {
    differential(1, 1);
}

#[test]
fn binary_replies_match_memcached_with_three_servers() {
    differential(3, 1);
}

#[test]
fn binary_replies_match_memcached_with_two_replicas() {
    differential(3, 2);
}

/// Bytes memcached answers and then closes on (or closes on silently):
/// mwproxy answers the same and closes too.
#[test]
fn closes_where_memcached_closes() {
    let direct = Memcached::start().unwrap();
    let servers = common::servers(1);
    let proxy = common::proxy(&servers, |_| {});
    let req = |opcode, extras: &[u8], key: &[u8], value: &[u8]| {
        let mut v = Vec::new();
        encode_request(&mut v, opcode, 9, 0, extras, key, value);
        v
    };
    let mut wrong_magic = req(op::GET, &[], b"k", &[]);
    wrong_magic.extend_from_slice(&req(op::GET, &[], b"k", &[]));
    let at = wrong_magic.len() / 2;
    wrong_magic[at] = 0x82;
    let mut short_body = req(op::GET, &[], b"key", &[]);
    short_body[11] = 1;
    let cases: Vec<Vec<u8>> = vec![
        wrong_magic,
        short_body,
        req(op::GET, b"ext!", b"k", &[]),
        req(op::SET, &[0; 4], b"k", b"v"),
        req(op::GET, &[], &[b'k'; 251], &[]),
        req(op::QUIT, &[], &[], &[]),
        [req(op::QUITQ, &[], &[], &[]), req(op::NOOP, &[], &[], &[])].concat(),
        // Text after binary is read as a binary header: wrong magic.
        [req(op::NOOP, &[], &[], &[]), b"get k\r\n".to_vec(), req(op::NOOP, &[], &[], &[])].concat(),
    ];
    common::closes_alike(direct.addr(), proxy.local_addr(), &cases);
    // A value over the limit is refused before it arrives, swallowed, and the
    // connection goes on (its key's old value dropped, as memcached does).
    let big = vec![b'x'; 2 << 20];
    let set = |v: &[u8]| req(op::SET, &[0; 8], b"big", v);
    let get = req(op::GET, &[], b"big", &[]);
    for addr in [direct.addr(), proxy.local_addr()] {
        let mut c = Side::connect(addr);
        c.stream.write_all(&set(b"old")).unwrap();
        c.stream.write_all(&[set(&big), get.clone(), req(op::NOOP, &[], &[], &[])].concat()).unwrap();
        let mut frames = Vec::new();
        while frames.len() < 4 {
            let mut chunk = [0u8; 4096];
            let n = c.stream.read(&mut chunk).unwrap();
            assert!(n > 0);
            c.buf.extend_from_slice(&chunk[..n]);
            frames.extend(c.take_frames());
        }
        let statuses: Vec<(u8, u16)> = frames.iter().map(|f| (f.0, f.1)).collect();
        assert_eq!(statuses, [(op::SET, 0), (op::SET, status::E2BIG), (op::GET, status::KEY_ENOENT), (op::NOOP, 0)]);
        assert_eq!(frames[1].6, b"Too large.");
    }
    let stats = common::client(&proxy).call_str("stats\r\n").unwrap();
    assert!(common::stat(&stats, "binary_connections") >= 9, "{stats}");
    common::stop(proxy);
}

fn sasl_auth(user: &str, password: &str) -> Vec<u8> {
    let mut v = Vec::new();
    encode_request(&mut v, op::SASL_AUTH, 1, 0, &[], b"PLAIN", format!("\0{user}\0{password}").as_bytes());
    v
}

fn frames_of(c: &mut Side, n: usize) -> Vec<(u8, u16, Vec<u8>)> {
    let mut frames = Vec::new();
    while frames.len() < n {
        frames.extend(c.take_frames().into_iter().map(|f| (f.0, f.1, f.6)));
        if frames.len() >= n {
            break;
        }
        let mut chunk = [0u8; 4096];
        let got = c.stream.read(&mut chunk).unwrap();
        if got == 0 {
            break;
        }
        c.buf.extend_from_slice(&chunk[..got]);
    }
    frames
}

/// SASL PLAIN against `--auth-file`: nothing but SASL and version before it,
/// a wrong password refused and counted, guesses pipelined behind a failure
/// never read, the connection closed at the failure limit.
#[test]
fn sasl_plain_logs_in_with_the_auth_file_users() {
    let servers = common::servers(1);
    let dir = std::env::temp_dir().join(format!("mwproxy-sasl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let users = dir.join("users");
    std::fs::write(&users, "alice:s3cret\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&users, std::fs::Permissions::from_mode(0o600)).unwrap();
    let proxy = common::proxy(&servers, |c| {
        c.auth.file = Some(users.to_string_lossy().into_owned());
        c.auth.max_failures = 3;
    });
    let addr = proxy.local_addr();
    let req = |opcode, key: &[u8], value: &[u8]| {
        let mut v = Vec::new();
        encode_request(&mut v, opcode, 1, 0, &[], key, value);
        v
    };

    // Before a login: mechanisms and version answer, anything else is refused and closes.
    let mut c = Side::connect(addr);
    c.stream.write_all(&[req(op::SASL_LIST_MECHS, &[], &[]), req(op::VERSION, &[], &[])].concat()).unwrap();
    let f = frames_of(&mut c, 2);
    assert_eq!((f[0].1, f[0].2.as_slice()), (0, &b"PLAIN"[..]));
    assert_eq!(f[1].1, 0);
    c.stream.write_all(&req(op::GET, b"k", &[])).unwrap();
    let f = frames_of(&mut c, 2);
    assert_eq!(f.len(), 1, "refused, then closed");
    assert_eq!((f[0].1, f[0].2.as_slice()), (status::AUTH_ERROR, &b"Auth failure."[..]));

    // A good login, then the cache works.
    let mut c = Side::connect(addr);
    c.stream.write_all(&sasl_auth("alice", "s3cret")).unwrap();
    let f = frames_of(&mut c, 1);
    assert_eq!((f[0].1, f[0].2.as_slice()), (0, &b"Authenticated"[..]));
    let ops =
        [(5, Op { opcode: op::SET, key: b"k".to_vec(), extras: vec![0; 8], value: b"v".to_vec(), cas: Cas::None })];
    let got = c.run(&ops, 6);
    assert_eq!((got[0].0, got[0].1), (op::SET, 0));

    // A wrong password, and a guess pipelined behind it: one refusal, the guess never read.
    let mut c = Side::connect(addr);
    c.stream.write_all(&[sasl_auth("alice", "guess1"), sasl_auth("alice", "s3cret")].concat()).unwrap();
    let f = frames_of(&mut c, 1);
    assert_eq!(f[0].1, status::AUTH_ERROR);
    c.stream.write_all(&req(op::NOOP, &[], &[])).unwrap();
    let f = frames_of(&mut c, 1);
    assert_eq!(f[0].1, status::AUTH_ERROR, "still not logged in: the pipelined guess was dropped");
    // The third failure closes; an authzid naming another user is a failure too.
    let mut v = Vec::new();
    encode_request(&mut v, op::SASL_AUTH, 1, 0, &[], b"PLAIN", b"bob\0alice\0s3cret");
    let mut c = Side::connect(addr);
    for _ in 0..3 {
        c.stream.write_all(&v).unwrap();
        let f = frames_of(&mut c, 1);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].1, status::AUTH_ERROR);
    }
    let mut rest = Vec::new();
    let _ = c.stream.read_to_end(&mut rest);
    assert!(rest.is_empty(), "closed after the third failure");
    let stats = common::client(&proxy);
    drop(stats);
    common::stop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server that is down: the binary client gets a temporary failure for
/// its keys, quiet or not, and the connection keeps serving.
#[test]
fn a_server_down_is_a_temporary_failure() {
    let mut servers = common::servers(1);
    let proxy = common::proxy(&servers, |_| {});
    servers[0].stop();
    let mut c = Side::connect(proxy.local_addr());
    let ops = [
        (2, Op { opcode: op::GETQ, key: b"k".to_vec(), extras: vec![], value: vec![], cas: Cas::None }),
        (3, Op { opcode: op::SETQ, key: b"k".to_vec(), extras: vec![0; 8], value: b"v".to_vec(), cas: Cas::None }),
    ];
    let got = c.run(&ops, 4);
    let statuses: Vec<(u8, u16)> = got.iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(statuses, [(op::GETQ, status::ETMPFAIL), (op::SETQ, status::ETMPFAIL), (op::NOOP, 0)]);
    assert!(String::from_utf8_lossy(&got[0].6).starts_with("backend127.0.0.1"), "{:?}", shown(&got[0]));
    common::stop(proxy);
}

/// A pipeline written one byte at a time gets the same responses as when
/// it is written whole (each against a proxy and servers of its own).
#[test]
fn a_pipeline_sent_byte_by_byte_gets_the_same_responses() {
    let mut rng = Rng(0xb17e);
    let ops: Vec<(u32, Op)> = (0..40).map(|i| (i + 1, random_op(&mut rng))).collect();
    let run = |byte_by_byte: bool| {
        let servers = common::servers(3);
        let proxy = common::proxy(&servers, |_| {});
        let mut c = Side::connect(proxy.local_addr());
        let seen = if byte_by_byte {
            let mut bytes = Vec::new();
            for (opaque, o) in &ops {
                let cas = if matches!(o.cas, Cas::None) { 0 } else { 0x7fff_ffff_fff0 };
                encode_request(&mut bytes, o.opcode, *opaque, cas, &o.extras, &o.key, &o.value);
            }
            encode_request(&mut bytes, op::NOOP, 100, 0, &[], &[], &[]);
            c.stream.set_nodelay(true).unwrap();
            for b in &bytes {
                c.stream.write_all(std::slice::from_ref(b)).unwrap();
            }
            let mut seen: Vec<Seen> = Vec::new();
            while !seen.iter().any(|f| f.0 == op::NOOP && f.2 == 100) {
                let mut chunk = [0u8; 65536];
                let n = c.stream.read(&mut chunk).unwrap();
                assert!(n > 0);
                c.buf.extend_from_slice(&chunk[..n]);
                seen.extend(
                    c.take_frames().into_iter().map(|(o, s, q, k, e, key, v)| (o, s, q, k != 0, e, key, unpadded(v))),
                );
            }
            seen
        } else {
            c.run(&ops, 100)
        };
        common::stop(proxy);
        seen
    };
    assert_eq!(run(true), run(false));
}

/// Random frames with the binary magic (wrong lengths, unknown opcodes,
/// bodies that never come, huge declared bodies) on many connections: the
/// proxy refuses or closes each, keeps no memory for bodies it skips, and
/// keeps serving a well-behaved client throughout.
#[test]
fn random_binary_frames_do_not_hurt_other_clients() {
    let servers = common::servers(1);
    let proxy = common::proxy(&servers, |_| {});
    let mut good = Side::connect(proxy.local_addr());
    let mut rng = Rng(0xf022);
    for round in 0..120u32 {
        let mut frame = vec![0x80, rng.below(0x30) as u8];
        frame.extend_from_slice(&(rng.below(300) as u16).to_be_bytes());
        frame.push(*rng.pick(&[0u8, 4, 8, 20, 255]));
        frame.extend_from_slice(&[0, 0, 0]);
        let body = *rng.pick(&[0u32, 3, 30, 300, 1 << 20, u32::MAX]);
        frame.extend_from_slice(&body.to_be_bytes());
        frame.extend_from_slice(&round.to_be_bytes());
        frame.extend_from_slice(&rng.bits().to_be_bytes());
        let tail = rng.below(400) as usize;
        frame.extend((0..tail).map(|_| rng.bits() as u8));
        let mut s = TcpStream::connect(proxy.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let _ = s.write_all(&frame);
        let mut sink = [0u8; 4096];
        let _ = s.read(&mut sink);
        drop(s);
        if round % 20 == 0 {
            let ops = [(
                1,
                Op { opcode: op::SET, key: b"ok".to_vec(), extras: vec![0; 8], value: b"v".to_vec(), cas: Cas::None },
            )];
            let got = good.run(&ops, 2);
            assert_eq!((got[0].0, got[0].1), (op::SET, 0), "round {round}");
        }
    }
    let stats = common::client(&proxy).call_str("stats\r\n").unwrap();
    assert!(common::stat(&stats, "protocol_errors") > 30, "{stats}");
    common::stop(proxy);
}

/// A binary key no text token can carry, left different on its replicas by
/// a server that was down during a write, is repaired (deleted in base64 on
/// the meta protocol) when the server is back, before it serves the key.
#[test]
fn a_binary_key_with_a_space_is_repaired_like_any_other() {
    let mut servers = common::servers(2);
    let proxy = common::proxy(&servers, |c| c.routing.replication = 2);
    let key = b"a key\twith spaces".to_vec();
    let set = |value: &[u8]| {
        [(1, Op { opcode: op::SET, key: key.clone(), extras: vec![0; 8], value: value.to_vec(), cas: Cas::None })]
    };
    let get = [(3, Op { opcode: op::GET, key: key.clone(), extras: vec![], value: vec![], cas: Cas::None })];
    let mut c = Side::connect(proxy.local_addr());
    assert_eq!(c.run(&set(b"old"), 2)[0].1, 0);
    servers[1].stop();
    let failed = c.run(&set(b"new"), 2);
    assert_eq!(failed[0].1, status::ETMPFAIL, "one replica missed the write: {}", shown(&failed[0]));
    servers[1].restart().unwrap();
    let stats = |what: &str| common::stat(&common::client(&proxy).call_str("stats\r\n").unwrap(), what);
    assert!(stats("repairs_queued") >= 2);
    // Reads keep coming until both servers were repaired: then the key is gone everywhere.
    assert!(
        common::eventually(common::PATIENCE, || {
            let r = c.run(&get, 4);
            r[0].1 == status::KEY_ENOENT && stats("repairs_done") >= 2
        }),
        "repaired: {} done",
        stats("repairs_done")
    );
    for s in &servers {
        let mut direct = mctest::Client::connect(s.addr()).unwrap();
        assert_eq!(direct.call_str("mg YSBrZXkJd2l0aCBzcGFjZXM= b v\r\n").unwrap(), "EN\r\n");
    }
    common::stop(proxy);
}
