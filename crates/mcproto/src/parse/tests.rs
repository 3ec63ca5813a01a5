//! Unit tests for request parsing: every command, every error reply, every
//! split point of a request, and random bytes.

use super::*;
use crate::response::{parse_response, Response};
use proptest::prelude::*;

fn lim() -> Limits {
    Limits::default()
}

fn req(input: &[u8]) -> (Request, usize) {
    match parse_request(input, &lim()) {
        Parsed::Request { request, consumed } => (request, consumed),
        other => panic!("expected a request from {:?}, got {other:?}", String::from_utf8_lossy(input)),
    }
}

fn rej(input: &[u8]) -> Rejection {
    match parse_request(input, &lim()) {
        Parsed::Reject(r) => r,
        other => panic!("expected a rejection from {:?}, got {other:?}", String::from_utf8_lossy(input)),
    }
}

fn reply_of(input: &[u8]) -> Option<&'static str> {
    rej(input).reply
}

fn keys(ks: &[&str]) -> Vec<Vec<u8>> {
    ks.iter().map(|k| k.as_bytes().to_vec()).collect()
}

#[test]
fn retrievals() {
    assert_eq!(req(b"get a\r\n"), (Request::Get { kind: GetKind::Get, exptime: 0, keys: keys(&["a"]) }, 7));
    assert_eq!(req(b"gets a  b\n").0, Request::Get { kind: GetKind::Gets, exptime: 0, keys: keys(&["a", "b"]) });
    assert_eq!(req(b"gat 10 a b\r\n").0, Request::Get { kind: GetKind::Gat, exptime: 10, keys: keys(&["a", "b"]) });
    assert_eq!(req(b"gats -1 a\r\n").0, Request::Get { kind: GetKind::Gats, exptime: -1, keys: keys(&["a"]) });
    assert_eq!(req(b"gat 10\r\n").0, Request::Get { kind: GetKind::Gat, exptime: 10, keys: vec![] });
    let many: String = (0..100).map(|i| format!(" k{i}")).collect();
    let (r, _) = req(format!("get{many}\r\n").as_bytes());
    let Request::Get { keys, .. } = r else { panic!() };
    assert_eq!(keys.len(), 100);
    assert_eq!(keys[99], b"k99");
}

#[test]
fn retrieval_errors() {
    assert_eq!(reply_of(b"get\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"gat x a\r\n"), Some(BAD_EXPTIME));
    let long = "k".repeat(251);
    assert_eq!(reply_of(format!("get a {long} b\r\n").as_bytes()), Some(BAD_FORMAT));
    assert!(matches!(parse_request(format!("get {}\r\n", "k".repeat(250)).as_bytes(), &lim()), Parsed::Request { .. }));
}

#[test]
fn storage_commands() {
    for (word, kind) in [
        ("set", StoreKind::Set),
        ("add", StoreKind::Add),
        ("replace", StoreKind::Replace),
        ("append", StoreKind::Append),
        ("prepend", StoreKind::Prepend),
    ] {
        let input = format!("{word} k 5 -1 4\r\nab\r\n\r\n");
        let (r, n) = req(input.as_bytes());
        assert_eq!(n, input.len());
        assert_eq!(
            r,
            Request::Store {
                kind,
                key: b"k".to_vec(),
                flags: 5,
                exptime: -1,
                cas: 0,
                data: b"ab\r\n".to_vec(),
                noreply: false
            }
        );
    }
    let (r, _) = req(b"cas k 0 0 1 77 noreply\r\nx\r\n");
    assert!(matches!(r, Request::Store { kind: StoreKind::Cas, cas: 77, noreply: true, .. }));
    let (r, _) = req(b"set k 0 0 0\r\n\r\n");
    assert!(matches!(r, Request::Store { ref data, .. } if data.is_empty()));
}

#[test]
fn storage_errors() {
    assert_eq!(reply_of(b"set k 0 0\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"set k 0 0 1 noreply x\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"cas k 0 0 1\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"set k x 0 1\r\n"), Some(BAD_FORMAT));
    assert_eq!(reply_of(b"set k 0 x 1\r\n"), Some(BAD_FORMAT));
    assert_eq!(reply_of(b"set k 0 0 -1\r\n"), Some(BAD_FORMAT));
    assert_eq!(reply_of(b"cas k 0 0 1 x\r\n"), Some(BAD_FORMAT));
    assert_eq!(reply_of(format!("set {} 0 0 1\r\n", "k".repeat(251)).as_bytes()), Some(BAD_FORMAT));
    // noreply silences the error, as in memcached.
    assert_eq!(reply_of(b"set k x 0 1 noreply\r\n"), None);
    // A bad command line does not swallow the data block: it is read as a command.
    assert_eq!(rej(b"set k x 0 1\r\nz\r\n").consumed, 13);
}

#[test]
fn bad_data_chunk_consumes_the_declared_block() {
    let r = rej(b"set k 0 0 3\r\nabcd\r\nget k\r\n");
    assert_eq!(r.reply, Some(BAD_CHUNK));
    assert_eq!(r.consumed, 13 + 5);
    assert_eq!(r.swallow, 0);
}

#[test]
fn too_large_values_are_swallowed() {
    let l = Limits { max_value_len: 10, ..lim() };
    let Parsed::Reject(r) = parse_request(b"set k 0 0 11\r\n", &l) else { panic!() };
    assert_eq!(r.reply, Some(TOO_LARGE));
    assert_eq!((r.consumed, r.swallow), (14, 13));
    assert_eq!(r.stale_key.as_deref(), Some(&b"k"[..]));
    let Parsed::Reject(r) = parse_request(b"add k 0 0 11 noreply\r\n", &l) else { panic!() };
    assert_eq!((r.reply, r.stale_key), (None, None));
}

#[test]
fn other_commands() {
    assert_eq!(req(b"delete k\r\n").0, Request::Delete { key: b"k".to_vec(), noreply: false });
    assert_eq!(req(b"delete k 0\r\n").0, Request::Delete { key: b"k".to_vec(), noreply: false });
    assert_eq!(req(b"delete k noreply\r\n").0, Request::Delete { key: b"k".to_vec(), noreply: true });
    assert_eq!(req(b"delete k 0 noreply\r\n").0, Request::Delete { key: b"k".to_vec(), noreply: true });
    assert_eq!(
        req(b"incr k 18446744073709551615\r\n").0,
        Request::Arith { kind: ArithKind::Incr, key: b"k".to_vec(), delta: u64::MAX, noreply: false }
    );
    assert_eq!(
        req(b"decr k 1 noreply\r\n").0,
        Request::Arith { kind: ArithKind::Decr, key: b"k".to_vec(), delta: 1, noreply: true }
    );
    assert_eq!(req(b"touch k 10\r\n").0, Request::Touch { key: b"k".to_vec(), exptime: 10, noreply: false });
    assert_eq!(req(b"flush_all\r\n").0, Request::FlushAll { delay: None, noreply: false });
    assert_eq!(req(b"flush_all noreply\r\n").0, Request::FlushAll { delay: None, noreply: true });
    assert_eq!(req(b"flush_all 5\r\n").0, Request::FlushAll { delay: Some(5), noreply: false });
    assert_eq!(req(b"flush_all 5 noreply\r\n").0, Request::FlushAll { delay: Some(5), noreply: true });
    assert_eq!(req(b"verbosity 1\r\n").0, Request::Verbosity { level: 1, noreply: false });
    assert_eq!(req(b"cache_memlimit 64\r\n").0, Request::CacheMemlimit { megabytes: 64, noreply: false });
    assert_eq!(req(b"cache_memlimit 64 noreply\r\n").0, Request::CacheMemlimit { megabytes: 64, noreply: true });
    assert_eq!(req(b"version\r\n").0, Request::Version);
    assert_eq!(req(b"quit\r\n").0, Request::Quit);
    assert_eq!(req(b"stats\r\n").0, Request::Stats { args: vec![] });
    assert_eq!(req(b"stats backends\r\n").0, Request::Stats { args: keys(&["backends"]) });
}

#[test]
fn other_command_errors() {
    assert_eq!(reply_of(b"delete\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"delete k 1\r\n"), Some(BAD_DELETE));
    assert_eq!(reply_of(b"delete k 0 0 0\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"incr k\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"incr k -1\r\n"), Some(BAD_DELTA));
    assert_eq!(reply_of(b"incr k abc\r\n"), Some(BAD_DELTA));
    assert_eq!(reply_of(b"decr k 1x noreply\r\n"), None);
    assert_eq!(reply_of(b"touch k x\r\n"), Some(BAD_EXPTIME));
    assert_eq!(reply_of(b"flush_all x\r\n"), Some(BAD_EXPTIME));
    assert_eq!(reply_of(b"flush_all 1 2 3\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"verbosity\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"verbosity x\r\n"), Some(BAD_FORMAT));
    assert_eq!(reply_of(b"cache_memlimit\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"cache_memlimit x\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"cache_memlimit x noreply\r\n"), None);
    assert_eq!(reply_of(b"bogus\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"x\r\n"), Some(ERROR));
    assert_eq!(reply_of(b"      \r\n"), Some(ERROR));
}

#[test]
fn line_rules() {
    // A NUL ends the line for the parser; the rest of the line is dropped.
    assert_eq!(req(b"get a\0b c\r\n").0, Request::Get { kind: GetKind::Get, exptime: 0, keys: keys(&["a"]) });
    // HTTP requests close the connection, as memcached does.
    assert!(rej(b"GET / HTTP/1.1\r\n").close);
    // Long lines without a newline close the connection, unless they are retrievals.
    let junk = vec![b'x'; 3000];
    assert!(rej(&junk).close);
    let mut long_get = b"get ".to_vec();
    long_get.extend(std::iter::repeat_n(b'k', 3000));
    assert_eq!(parse_request(&long_get, &lim()), Parsed::Incomplete);
}

/// Every proper prefix of a request is incomplete and the whole is parsed.
#[test]
fn every_split_point() {
    let inputs: &[&[u8]] = &[
        b"get a b c\r\n",
        b"gats 5 a\r\n",
        b"set key 1 2 10\r\n0123\r\n6789\r\n",
        b"cas key 1 2 3 99 noreply\r\nabc\r\n",
        b"delete key 0 noreply\r\n",
        b"incr key 5\r\n",
        b"touch key 5\r\n",
        b"flush_all 10\r\n",
        b"verbosity 1\r\n",
        b"cache_memlimit 100 noreply\r\n",
        b"stats backends\r\n",
        b"version\r\n",
    ];
    for input in inputs {
        for split in 0..input.len() {
            assert_eq!(parse_request(&input[..split], &lim()), Parsed::Incomplete, "{input:?} at {split}");
        }
        let (_, n) = req(input);
        assert_eq!(n, input.len());
    }
}

#[test]
fn pipelined_requests_parse_one_after_another() {
    let input = b"set a 0 0 1\r\nx\r\nget a\r\nbogus\r\ndelete a\r\n";
    let mut at = 0;
    let mut seen = Vec::new();
    while at < input.len() {
        match parse_request(&input[at..], &lim()) {
            Parsed::Request { request, consumed } => {
                seen.push(format!("{request:?}").split_whitespace().next().unwrap().to_string());
                at += consumed;
            }
            Parsed::Reject(r) => {
                seen.push(r.reply.unwrap().to_string());
                at += r.consumed;
            }
            Parsed::Incomplete => panic!("incomplete at {at}"),
        }
    }
    assert_eq!(seen, ["Store", "Get", "ERROR", "Delete"]);
}

#[test]
fn responses_parse_and_round_trip() {
    let input = b"VALUE a 5 3 12\r\nx\r\n\r\nVALUE b 0 0\r\n\r\nEND\r\n";
    let (r, n) = parse_response(input).unwrap().unwrap();
    assert_eq!(n, input.len());
    let Response::Values(ref vs) = r else { panic!() };
    assert_eq!(vs.len(), 2);
    assert_eq!((vs[0].key, vs[0].flags, vs[0].cas, vs[0].data), (&b"a"[..], 5, Some(12), &b"x\r\n"[..]));
    let mut out = Vec::new();
    r.encode(&mut out);
    assert_eq!(out, input);
    for split in 0..input.len() {
        assert_eq!(parse_response(&input[..split]).unwrap(), None);
        assert_eq!(crate::response_len(&input[..split]).unwrap(), None);
    }
    assert_eq!(crate::response_len(input).unwrap(), Some(input.len()));
    for line in [&b"STORED\r\n"[..], b"NOT_FOUND\r\n", b"42\r\n", b"SERVER_ERROR busy\r\n", b"VERSION 1.6\r\n"] {
        let (r, n) = parse_response(line).unwrap().unwrap();
        assert_eq!(n, line.len());
        let mut out = Vec::new();
        r.encode(&mut out);
        assert_eq!(out, line);
    }
    let (r, _) = parse_response(b"STAT pid 12\r\nSTAT version 1.6 x\r\nEND\r\n").unwrap().unwrap();
    assert_eq!(r, Response::Stats(vec![(&b"pid"[..], &b"12"[..]), (&b"version"[..], &b"1.6 x"[..])]));
    assert!(parse_response(b"VALUE a x 1\r\nz\r\nEND\r\n").is_err());
    assert!(parse_response(b"VALUE a 0 1\r\nzzz\r\nEND\r\n").is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Random bytes never panic the parser and it never claims more than it was given.
    #[test]
    fn random_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..600)) {
        check_consumed(&input);
    }

    /// Random lines built from protocol words exercise the interesting paths more often.
    #[test]
    fn random_protocol_words(words in proptest::collection::vec(
        prop_oneof![
            Just("get"), Just("gets"), Just("gat"), Just("set"), Just("cas"), Just("incr"),
            Just("delete"), Just("touch"), Just("flush_all"), Just("noreply"), Just("0"),
            Just("1"), Just("-1"), Just("5"), Just("k"), Just("\r\n"), Just("\n"), Just(" "),
            Just("abc"), Just("\0"), Just("99999999999"), Just("mg"), Just("ms"), Just("md"),
            Just("ma"), Just("me"), Just("mn"), Just("b"), Just("q"), Just("Zm9v"),
        ], 0..30)) {
        check_consumed(words.concat().as_bytes());
    }

    /// Random bytes never panic the response parser either.
    #[test]
    fn random_response_bytes(input in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(Some((_, n))) = parse_response(&input) {
            prop_assert!(n <= input.len());
        }
        if let Ok(Some(n)) = crate::response::meta_reply_len(&input) {
            prop_assert!(n <= input.len());
        }
    }

    /// Meta replies built from their words are framed within the input.
    #[test]
    fn random_meta_replies(words in proptest::collection::vec(
        prop_oneof![
            Just("VA "), Just("2"), Just("99999999999999999999"), Just(" "), Just("\r\n"), Just("hi"),
            Just("HD"), Just("EN"), Just("MN"), Just("MN\r\n"), Just("VA 2\r\nMN\r\n"),
        ], 0..20)) {
        let input = words.concat();
        if let Ok(Some(n)) = crate::response::meta_reply_len(input.as_bytes()) {
            prop_assert!(n <= input.len());
            prop_assert!(input.as_bytes()[..n].ends_with(b"MN\r\n"));
        }
    }
}

/// A request line (and data block) built from generated parts.
fn generated_request() -> impl Strategy<Value = Vec<u8>> {
    let key = "[a-zA-Z0-9_:.-]{1,20}";
    prop_oneof![
        (key, proptest::collection::vec(any::<u8>(), 0..100), any::<u16>(), 0u32..100_000).prop_map(
            |(k, data, flags, exp)| {
                let mut r = format!("set {k} {flags} {exp} {}\r\n", data.len()).into_bytes();
                r.extend_from_slice(&data);
                r.extend_from_slice(b"\r\n");
                r
            }
        ),
        proptest::collection::vec(key, 1..8).prop_map(|ks| format!("get {}\r\n", ks.join(" ")).into_bytes()),
        (key, 0u64..1000).prop_map(|(k, n)| format!("incr {k} {n}\r\n").into_bytes()),
        key.prop_map(|k| format!("delete {k} noreply\r\n").into_bytes()),
        (key, "[vtfsq]{0,4}").prop_map(|(k, f)| {
            let flags: Vec<String> = f.chars().map(String::from).collect();
            format!("mg {k} {}\r\n", flags.join(" ")).into_bytes()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// A generated request split at every byte boundary: every strict prefix
    /// asks for more bytes, the whole is one request of exactly its length.
    #[test]
    fn generated_requests_split_anywhere(r in generated_request()) {
        for cut in 0..r.len() {
            prop_assert!(matches!(parse_request(&r[..cut], &lim()), Parsed::Incomplete), "prefix of {}", cut);
        }
        match parse_request(&r, &lim()) {
            Parsed::Request { consumed, .. } => prop_assert_eq!(consumed, r.len()),
            other => prop_assert!(false, "{:?} from {:?}", other, String::from_utf8_lossy(&r)),
        }
    }

    /// The login parser (memcached's `-Y` exchange) never panics nor claims
    /// more than it was given.
    #[test]
    fn random_logins_never_panic(input in proptest::collection::vec(
        prop_oneof![
            Just(b"set ".to_vec()), Just(b"auth ".to_vec()), Just(b"0 ".to_vec()), Just(b"12".to_vec()),
            Just(b"\r\n".to_vec()), Just(b"alice secret".to_vec()), Just(b"-1 ".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..20),
        ], 0..20)) {
        let input = input.concat();
        match crate::auth::parse_auth(&input) {
            crate::auth::Auth::Refused { consumed, .. } | crate::auth::Auth::Credentials { consumed, .. } => {
                prop_assert!(consumed > 0 && consumed <= input.len());
            }
            crate::auth::Auth::Incomplete | crate::auth::Auth::Close => {}
        }
    }
}

fn check_consumed(input: &[u8]) {
    let l = Limits { max_value_len: 64, max_line_len: 128, ..lim() };
    let mut at = 0;
    while at < input.len() {
        match parse_request(&input[at..], &l) {
            Parsed::Incomplete => break,
            Parsed::Request { consumed, .. } => {
                assert!(consumed > 0 && consumed <= input.len() - at);
                at += consumed;
            }
            Parsed::Reject(r) => {
                if r.close {
                    break;
                }
                assert!(r.consumed > 0 && r.consumed <= input.len() - at);
                at += r.consumed + r.swallow.min(input.len() - at - r.consumed);
            }
        }
    }
}

fn meta(input: &[u8]) -> (MetaKind, Vec<u8>, Vec<u8>, usize) {
    match req(input) {
        (Request::Meta { kind, key, raw }, consumed) => (kind, key, raw, consumed),
        (other, _) => panic!("expected a meta command, got {other:?}"),
    }
}

#[test]
fn meta_commands_keep_their_bytes_and_are_placed_by_key() {
    let (kind, key, raw, used) = meta(b"mg foo v t O123 q\r\nnext");
    assert_eq!(
        (kind, key.as_slice(), raw.as_slice(), used),
        (MetaKind::Get, &b"foo"[..], &b"mg foo v t O123 q\r\n"[..], 19)
    );
    let (kind, key, raw, _) = meta(b"ms foo 5 T90 F1\r\nhe\r\no\r\nmg foo\r\n");
    assert_eq!(
        (kind, key.as_slice(), raw.as_slice()),
        (MetaKind::Set, &b"foo"[..], &b"ms foo 5 T90 F1\r\nhe\r\no\r\n"[..])
    );
    assert_eq!(meta(b"md foo q\n").0, MetaKind::Delete);
    assert_eq!(meta(b"ma foo D5 MD\r\n").0, MetaKind::Arith);
    assert_eq!(meta(b"me foo\r\n").0, MetaKind::Debug);
    let (kind, key, raw, _) = meta(b"mn\r\n");
    assert_eq!((kind, key.len(), raw.as_slice()), (MetaKind::Noop, 0, &b"mn\r\n"[..]));
    // A base64 key (flag b) is placed by what it decodes to; one that does not
    // decode is left to the server to refuse.
    assert_eq!(meta(b"mg Zm9v b v\r\n").1, b"foo");
    assert_eq!(meta(b"ms Zm9v 1 b\r\nx\r\n").1, b"foo");
    assert_eq!(meta(b"mg !!!! b v\r\n").1, b"!!!!");
    let mut encoded = Vec::new();
    meta(b"ms k 1 I\r\nx\r\n").2.clone_into(&mut encoded);
    let mut again = Vec::new();
    req(b"ms k 1 I\r\nx\r\n").0.encode(&mut again, true);
    assert_eq!(again, encoded, "a meta command is forwarded as it came");
}

#[test]
fn meta_errors_as_memcached_gives_them() {
    let long = format!("mg {} v\r\n", "k".repeat(251));
    assert_eq!(reply_of(long.as_bytes()), Some(BAD_FORMAT));
    for bare in [&b"mg\r\n"[..], b"ms\r\n", b"md\r\n", b"ma\r\n"] {
        assert_eq!(reply_of(bare), Some(ERROR));
    }
    assert_eq!(reply_of(b"me\r\n"), Some(BAD_FORMAT));
    assert_eq!(reply_of(b"ms k\r\n"), Some(BAD_FORMAT));
    assert_eq!(reply_of(b"ms k abc\r\n"), Some(BAD_FORMAT));
    assert_eq!(reply_of(b"ms k -1\r\n"), Some(BAD_FORMAT));
    let r = rej(b"ms k 2 q\r\nhix\r\n");
    assert_eq!((r.reply, r.consumed), (Some(BAD_CHUNK), 14));
    let r = rej(b"ms k 2000000 T0\r\n");
    assert_eq!((r.reply, r.consumed, r.swallow), (Some(TOO_LARGE), 17, 2_000_002));
    assert_eq!(r.stale_key.as_deref(), Some(&b"k"[..]));
    assert_eq!(parse_request(b"ms k 5\r\nhel", &lim()), Parsed::Incomplete);
    assert_eq!(reply_of(b"MG k v\r\n"), Some(ERROR), "commands are case-sensitive");
}

#[test]
fn a_storage_request_declares_its_length_before_its_data_arrives() {
    let set = b"set k 0 0 5\r\nhello\r\n";
    assert_eq!(declared_len(&set[..13]), Some(set.len()), "once the line is there");
    assert_eq!(declared_len(&set[..8]), None, "the line is still coming");
    let cas = b"cas k 0 0 3 99\r\n";
    assert_eq!(declared_len(cas), Some(cas.len() + 3 + 2));
    let ms = b"ms k 1048576 T0\r\n";
    assert_eq!(declared_len(ms), Some(ms.len() + 1_048_576 + 2));
    assert_eq!(declared_len(b"get k\r\n"), None);
    assert_eq!(declared_len(b"set k 0 0 -1\r\n"), None);
}
