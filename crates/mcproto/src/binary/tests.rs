use proptest::prelude::*;

use super::*;

fn req(opcode: u8, opaque: u32, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(&mut out, opcode, opaque, cas, extras, key, value);
    out
}

fn parse(buf: &[u8]) -> Binary {
    parse_binary(buf, &Limits::default(), false, true)
}

fn raw_of(b: Binary) -> (Vec<u8>, Ctx) {
    match b {
        Binary::Request { request: Request::Meta { raw, .. }, ctx, .. } => (raw, ctx),
        other => panic!("not a meta request: {other:?}"),
    }
}

fn set_extras(flags: u32, exp: u32) -> Vec<u8> {
    [flags.to_be_bytes(), exp.to_be_bytes()].concat()
}

#[test]
fn requests_become_meta_commands() {
    let (raw, ctx) = raw_of(parse(&req(op::GETKQ, 7, 0, &[], b"k1", &[])));
    assert_eq!(raw, b"mg k1 f c v\r\n");
    assert_eq!(ctx, Ctx { opcode: op::GETKQ, opaque: 7, key: b"k1".to_vec() });
    let (raw, _) = raw_of(parse(&req(op::SET, 1, 0, &set_extras(5, 60), b"k", b"a\r\nb")));
    assert_eq!(raw, b"ms k 4 c MS F5 T60\r\na\r\nb\r\n");
    let (raw, _) = raw_of(parse(&req(op::ADDQ, 1, 99, &set_extras(0, 0), b"k", b"v")));
    assert_eq!(raw, b"ms k 1 c MS F0 T0 C99\r\nv\r\n", "a store with a cas is a cas, as in memcached");
    let (raw, _) = raw_of(parse(&req(op::PREPEND, 1, 0, &[], b"k", b"v")));
    assert_eq!(raw, b"ms k 1 c MP\r\nv\r\n");
    let (raw, _) = raw_of(parse(&req(op::DELETE, 1, 12, &[], b"k", &[])));
    assert_eq!(raw, b"md k C12\r\n");
    let incr = [5u64.to_be_bytes().as_slice(), &10u64.to_be_bytes(), &0u32.to_be_bytes()].concat();
    let (raw, _) = raw_of(parse(&req(op::INCREMENT, 1, 0, &incr, b"n", &[])));
    assert_eq!(raw, b"ma n MI D5 v c N0 J10\r\n");
    let no_create = [5u64.to_be_bytes().as_slice(), &10u64.to_be_bytes(), &u32::MAX.to_be_bytes()].concat();
    let (raw, _) = raw_of(parse(&req(op::DECREMENTQ, 1, 0, &no_create, b"n", &[])));
    assert_eq!(raw, b"ma n MD D5 v c\r\n");
    let (raw, _) = raw_of(parse(&req(op::TOUCH, 1, 0, &30u32.to_be_bytes(), b"k", &[])));
    assert_eq!(raw, b"mg k T30 f c\r\n");
    let (raw, _) = raw_of(parse(&req(op::GATK, 1, 0, &u32::MAX.to_be_bytes(), b"k", &[])));
    assert_eq!(raw, b"mg k T2147483647 f c v\r\n");
    let (raw, _) = raw_of(parse(&req(op::GET, 1, 0, &[], b"a key\n", &[])));
    assert_eq!(raw, b"mg YSBrZXkK b f c v\r\n", "a key that is no text token goes in base64");
    let (raw, _) = raw_of(parse(&req(op::SET, 1, 0, &set_extras(0, 0), b"a b", b"v")));
    assert_eq!(raw, b"ms YSBi 1 b c MS F0 T0\r\nv\r\n", "the length comes right after the key");
    match parse(&req(op::STAT, 3, 0, &[], b"settings", &[])) {
        Binary::Request { request: Request::Stats { args }, .. } => assert_eq!(args, vec![b"settings".to_vec()]),
        other => panic!("{other:?}"),
    }
    match parse(&req(op::FLUSHQ, 3, 0, &9u32.to_be_bytes(), &[], &[])) {
        Binary::Request { request, .. } => assert_eq!(request, Request::FlushAll { delay: Some(9), noreply: false }),
        other => panic!("{other:?}"),
    }
}

#[test]
fn refusals_follow_memcached() {
    let refused = |b: Binary| match b {
        Binary::Refuse { reply, consumed, swallow, close, .. } => {
            let status = Frame::read(&reply).map(|(f, _)| f.status);
            (status, consumed, swallow, close)
        }
        other => panic!("not refused: {other:?}"),
    };
    let mut bad_magic = req(op::GET, 0, 0, &[], b"k", &[]);
    bad_magic[0] = 0x81;
    assert_eq!(refused(parse(&bad_magic)), (None, 0, 0, true));
    assert_eq!(refused(parse(&req(op::GET, 0, 0, b"xxxx", b"k", &[]))), (Some(status::EINVAL), 0, 0, true));
    assert_eq!(refused(parse(&req(op::GET, 0, 0, &[], &[b'k'; 251], &[]))), (Some(status::EINVAL), 0, 0, true));
    assert_eq!(refused(parse(&req(0x45, 0, 0, &[], b"k", b"abc"))), (Some(status::UNKNOWN_COMMAND), 24, 4, false));
    let mut lying = req(op::GET, 0, 0, &[], b"key", &[]);
    lying[11] = 1; // body shorter than the key
    assert_eq!(refused(parse(&lying)), (Some(status::UNKNOWN_COMMAND), 0, 0, true));
    let big = vec![b'x'; 2 << 20];
    let r = parse(&req(op::SET, 0, 0, &set_extras(0, 0), b"k", &big)[..40]);
    assert_eq!(refused(r), (Some(status::E2BIG), 24 + 8 + 1, 2 << 20, false), "refused before the value arrives");
    // With logins required, only SASL and version pass.
    let locked = parse_binary(&req(op::GET, 0, 0, &[], b"k", &[]), &Limits::default(), true, false);
    assert_eq!(refused(locked), (Some(status::AUTH_ERROR), 0, 0, true));
    let version = parse_binary(&req(op::VERSION, 0, 0, &[], &[], &[]), &Limits::default(), true, false);
    assert!(matches!(version, Binary::Request { request: Request::Version, .. }));
    // Before login, a frame is judged by its header: a 65,535-byte key, or a
    // body larger than a SASL exchange, closes the connection before any of it is buffered.
    let header_with = |opcode: u8, keylen: u16, bodylen: u32, logged_in: bool| {
        let mut h = Vec::new();
        Header { magic: REQUEST_MAGIC, opcode, keylen, extlen: 0, bodylen, opaque: 0, cas: 0 }.write(&mut h);
        parse_binary(&h, &Limits::default(), true, logged_in)
    };
    let header_only = |opcode: u8, keylen: u16, bodylen: u32| header_with(opcode, keylen, bodylen, false);
    assert_eq!(refused(header_only(op::GET, u16::MAX, u32::from(u16::MAX))), (Some(status::AUTH_ERROR), 0, 0, true));
    assert_eq!(refused(header_only(op::SASL_AUTH, u16::MAX, u32::from(u16::MAX))), (Some(status::EINVAL), 0, 0, true));
    let too_long = (MAX_UNAUTHENTICATED_BODY + 1) as u32;
    assert_eq!(refused(header_only(op::SASL_AUTH, 5, too_long)), (Some(status::EINVAL), 0, 0, true));
    assert_eq!(header_only(op::SASL_AUTH, 5, 100), Binary::Incomplete, "a login of a plausible size is awaited");
    assert_eq!(frame_len(&req(op::SET, 0, 0, &set_extras(0, 0), b"k", b"value")[..24]), Some(24 + 8 + 1 + 5));
    // Logged in, a large key is refused as memcached refuses it (after its bytes).
    assert_eq!(header_with(op::GET, 300, 300, true), Binary::Incomplete);
    // Without logins the SASL commands are unknown.
    let mechs = parse(&req(op::SASL_LIST_MECHS, 0, 0, &[], &[], &[]));
    assert_eq!(refused(mechs), (Some(status::UNKNOWN_COMMAND), 24, 0, false));
}

fn ctx(opcode: u8, key: &[u8]) -> Ctx {
    Ctx { opcode, opaque: 0xdead_beef, key: key.to_vec() }
}

fn frame(bytes: &[u8]) -> (u16, u64, Vec<u8>, Vec<u8>, Vec<u8>) {
    let (f, n) = Frame::read(bytes).expect("one whole frame");
    assert_eq!(n, bytes.len());
    assert_eq!(f.opaque, 0xdead_beef);
    (f.status, f.cas, f.extras.to_vec(), f.key.to_vec(), f.value.to_vec())
}

#[test]
fn replies_become_binary_responses() {
    let hit = b"VA 3 f7 c42\r\nabc\r\n";
    assert_eq!(frame(&reply(&ctx(op::GET, &[]), hit)), (0, 42, 7u32.to_be_bytes().to_vec(), vec![], b"abc".to_vec()));
    assert_eq!(frame(&reply(&ctx(op::GETKQ, b"k"), hit)).3, b"k");
    assert_eq!(frame(&reply(&ctx(op::TOUCH, &[]), b"HD f7 c42\r\n")).4, b"");
    assert!(reply(&ctx(op::GETQ, &[]), b"EN\r\n").is_empty(), "a quiet miss is silent");
    assert_eq!(frame(&reply(&ctx(op::GET, &[]), b"EN\r\n")).4, b"Not found");
    assert_eq!(frame(&reply(&ctx(op::GETK, b"k"), b"EN\r\n")), (1, 0, vec![], b"k".to_vec(), vec![]));
    assert_eq!(frame(&reply(&ctx(op::SET, &[]), b"HD c9\r\n")).1, 9);
    assert!(reply(&ctx(op::SETQ, &[]), b"HD c9\r\n").is_empty());
    assert_eq!(frame(&reply(&ctx(op::ADDQ, &[]), b"NS\r\n")).0, status::KEY_EEXISTS, "quiet errors are sent");
    assert_eq!(frame(&reply(&ctx(op::REPLACE, &[]), b"NS\r\n")).0, status::KEY_ENOENT);
    assert_eq!(frame(&reply(&ctx(op::APPEND, &[]), b"NS\r\n")).4, b"Not stored.");
    assert_eq!(frame(&reply(&ctx(op::SET, &[]), b"EX\r\n")).4, b"Data exists for key.");
    assert_eq!(frame(&reply(&ctx(op::DELETE, &[]), b"NF\r\n")).0, status::KEY_ENOENT);
    let n = frame(&reply(&ctx(op::INCREMENT, &[]), b"VA 2 c5\r\n15\r\n"));
    assert_eq!((n.1, n.4), (5, 15u64.to_be_bytes().to_vec()));
    let bad = reply(&ctx(op::DECREMENT, &[]), b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
    assert_eq!(frame(&bad).0, status::DELTA_BADVAL);
    let down = frame(&reply(&ctx(op::GETQ, &[]), b"SERVER_ERROR backend 127.0.0.1:1 unavailable\r\n"));
    assert_eq!((down.0, down.4), (status::ETMPFAIL, b"backend 127.0.0.1:1 unavailable".to_vec()));
    assert_eq!(frame(&reply(&ctx(op::SET, &[]), b"SERVER_ERROR object too large for cache\r\n")).0, status::E2BIG);
    assert_eq!(frame(&reply(&ctx(op::VERSION, &[]), b"VERSION 1.6.18\r\n")).4, b"1.6.18");
    let stats = reply(&ctx(op::STAT, &[]), b"STAT pid 1\r\nSTAT uptime 2\r\nEND\r\n");
    let (f1, n1) = Frame::read(&stats).unwrap();
    assert_eq!((f1.key, f1.value), (&b"pid"[..], &b"1"[..]));
    let (f2, n2) = Frame::read(&stats[n1..]).unwrap();
    assert_eq!(f2.key, b"uptime");
    let (f3, n3) = Frame::read(&stats[n1 + n2..]).unwrap();
    assert_eq!((f3.key, f3.value, n1 + n2 + n3), (&b""[..], &b""[..], stats.len()));
}

/// Every request cut at every byte: incomplete until its last byte, then the
/// same request as when it came whole.
#[test]
fn a_request_split_at_every_byte_parses_the_same() {
    let incr = [1u64.to_be_bytes().as_slice(), &0u64.to_be_bytes(), &0u32.to_be_bytes()].concat();
    let requests = [
        req(op::GETQ, 1, 0, &[], b"key", &[]),
        req(op::SET, 2, 3, &set_extras(1, 2), b"key", b"value\r\nwith lines"),
        req(op::INCREMENT, 3, 0, &incr, b"n", &[]),
        req(op::GAT, 4, 0, &5u32.to_be_bytes(), b"key", &[]),
        req(op::STAT, 5, 0, &[], b"items", &[]),
        req(op::NOOP, 6, 0, &[], &[], &[]),
        req(op::APPENDQ, 7, 0, &[], b"k", b"more"),
    ];
    for r in &requests {
        let whole = parse(r);
        assert!(!matches!(whole, Binary::Incomplete | Binary::Refuse { .. }), "{whole:?}");
        for cut in 0..r.len() {
            assert_eq!(parse(&r[..cut]), Binary::Incomplete, "cut at {cut} of {r:?}");
        }
        let mut longer = r.clone();
        longer.extend_from_slice(&req(op::NOOP, 9, 0, &[], &[], &[]));
        assert_eq!(parse(&longer), whole, "bytes after the request change nothing");
    }
}

proptest! {
    /// Garbage never panics, never consumes more than it was given (unless
    /// told to skip bytes still to come), and a request always makes progress.
    #[test]
    fn garbage_is_refused_or_parsed_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200), magic in any::<bool>()) {
        let mut buf = bytes;
        if magic && !buf.is_empty() {
            buf[0] = REQUEST_MAGIC;
        }
        for auth in [false, true] {
            match parse_binary(&buf, &Limits::default(), auth, !auth) {
                Binary::Incomplete | Binary::Quit { .. } => {}
                Binary::Request { consumed, .. } | Binary::Noop { consumed, .. } | Binary::Sasl { consumed, .. } => {
                    prop_assert!(consumed >= HEADER_LEN && consumed <= buf.len());
                }
                Binary::Refuse { consumed, close, .. } => prop_assert!(close || (consumed > 0 && consumed <= buf.len())),
            }
        }
    }

    /// Every reply a server can give turns into whole frames (or nothing).
    #[test]
    fn every_reply_turns_into_frames(opcode in 0u8..0x30, line in "[A-Z]{2}( [a-z][0-9]{1,5}){0,3}") {
        let text = format!("{line}\r\n");
        let out = reply(&Ctx { opcode, opaque: 1, key: b"k".to_vec() }, text.as_bytes());
        let mut at = 0;
        while at < out.len() {
            let (_, n) = Frame::read(&out[at..]).expect("whole frames");
            at += n;
        }
    }
}
