//! The RESP request parser under generated input (proptest; a failing case
//! is shrunk and kept in `proptest-regressions/` beside this file, and run
//! first from then on): random bytes never panic it, whatever the chunks they
//! arrive in, and the chunks never change what it reads; generated requests
//! — arrays of bulk strings and inline commands — come back as the
//! arguments they were made of, split at every byte boundary.

use proptest::prelude::*;
use respproto::server::{Request, RequestParser};

/// What a parser reads from `input` delivered in `chunks` (lengths, cycled):
/// the requests, then the protocol error that ended it, if any.
fn read(input: &[u8], chunks: &[usize], max_arg: usize) -> (Vec<Request>, Option<String>) {
    let mut p = RequestParser::new(max_arg);
    let mut out = Vec::new();
    let (mut at, mut k) = (0, 0);
    while at < input.len() {
        let size = chunks.get(k % chunks.len().max(1)).copied().unwrap_or(input.len()).max(1);
        k += 1;
        let end = (at + size).min(input.len());
        let mut piece = &input[at..end];
        while !piece.is_empty() {
            let (n, r) = p.feed(piece);
            assert!(n <= piece.len(), "consumed {n} of {}", piece.len());
            match r {
                Ok(Some(req)) => out.push(req),
                Ok(None) => assert_eq!(n, piece.len(), "stopped early without a request"),
                Err(e) => return (out, Some(e.0)),
            }
            if n == 0 {
                break;
            }
            piece = &piece[n..];
        }
        at = end;
    }
    (out, None)
}

fn frame(args: &[Vec<u8>]) -> Vec<u8> {
    let mut f = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        f.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        f.extend_from_slice(a);
        f.extend_from_slice(b"\r\n");
    }
    f
}

fn arg() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..40),
        Just(b"SEND".to_vec()),
        Just(b"\r\n*3\r\n$".to_vec()),
        Just(vec![b'x'; 300]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    /// Random bytes in random chunks: no panic, and what is read does not
    /// depend on the chunks.
    #[test]
    fn random_bytes_in_any_chunks(
        input in proptest::collection::vec(any::<u8>(), 0..800),
        chunks in proptest::collection::vec(1usize..64, 1..8),
    ) {
        let whole = read(&input, &[input.len().max(1)], 64);
        let pieces = read(&input, &chunks, 64);
        prop_assert_eq!(whole, pieces);
    }

    /// Random protocol tokens: the interesting paths (headers, lengths, CRLFs) more often.
    #[test]
    fn random_protocol_tokens(
        words in proptest::collection::vec(prop_oneof![
            Just("*"), Just("$"), Just("\r\n"), Just("\n"), Just("3"), Just("-1"), Just("0"), Just("99999999999"),
            Just("PING"), Just(" "), Just("\""), Just("abc"), Just("*1\r\n$4\r\nPING\r\n"), Just("+"), Just(":1"),
        ], 0..40),
        chunks in proptest::collection::vec(1usize..16, 1..6),
    ) {
        let input = words.concat().into_bytes();
        prop_assert_eq!(read(&input, &[input.len().max(1)], 16), read(&input, &chunks, 16));
    }

    /// Generated requests come back whole, split at every byte boundary.
    #[test]
    fn generated_requests_split_anywhere(requests in proptest::collection::vec(
        proptest::collection::vec(arg(), 1..6), 1..4)) {
        let input: Vec<u8> = requests.iter().flat_map(|r| frame(r)).collect();
        let expected: Vec<Request> = requests.iter().map(|r| Request::Args(r.clone())).collect();
        for cut in 0..=input.len() {
            let (got, err) = read(&input, &[cut.max(1), input.len()], 1 << 20);
            prop_assert_eq!(err, None);
            prop_assert_eq!(&got, &expected, "split at {}", cut);
        }
    }

    /// An argument over the limit is read past and refused, and the next request is read as usual.
    #[test]
    fn an_argument_over_the_limit_is_skipped(len in 17usize..200, split in 1usize..50) {
        let mut input = frame(&[b"SEND".to_vec(), b"q".to_vec(), vec![b'z'; len]]);
        input.extend(frame(&[b"PING".to_vec()]));
        let (got, err) = read(&input, &[split], 16);
        prop_assert_eq!(err, None);
        prop_assert_eq!(got, vec![
            Request::TooLarge { command: Some(b"SEND".to_vec()), len },
            Request::Args(vec![b"PING".to_vec()]),
        ]);
    }
}

/// Inline commands, as redis-cli sends them when typed into telnet.
#[test]
fn inline_commands_split_anywhere() {
    let input = b"PING\r\nSEND q \"a b\"\r\n";
    for cut in 1..=input.len() {
        let (got, err) = read(input, &[cut, input.len()], 1024);
        assert_eq!(err, None, "split at {cut}");
        assert_eq!(got.len(), 2, "split at {cut}: {got:?}");
        assert_eq!(got[0], Request::Args(vec![b"PING".to_vec()]));
    }
}

/// What the client side reads of a server reply, split at every byte boundary.
fn client_read(input: &[u8], cut: usize) -> Vec<respproto::client::MqReply> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    for piece in [&input[..cut], &input[cut..]] {
        buf.extend_from_slice(piece);
        while let Ok(Some((reply, used))) = respproto::client::parse(&buf) {
            assert!(used > 0 && used <= buf.len());
            out.push(reply);
            buf.drain(..used);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// The client's reply reader never panics on random bytes, nor claims more than it was given.
    #[test]
    fn client_reads_random_bytes_safely(input in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(Some((_, used))) = respproto::client::parse(&input) {
            prop_assert!(used > 0 && used <= input.len());
        }
    }

    /// Requests the client writes are the arguments the server reads back.
    #[test]
    fn client_requests_round_trip_through_the_server_parser(
        requests in proptest::collection::vec(proptest::collection::vec(arg(), 1..6), 1..4),
    ) {
        let mut input = Vec::new();
        for r in &requests {
            let args: Vec<&[u8]> = r.iter().map(Vec::as_slice).collect();
            respproto::client::push_request(&mut input, &args);
        }
        let expected: Vec<Request> = requests.iter().map(|r| Request::Args(r.clone())).collect();
        prop_assert_eq!(read(&input, &[7], 1 << 20), (expected, None));
    }

    /// Replies the server encodes are read whole by the client, split anywhere.
    #[test]
    fn server_replies_are_read_by_the_client_split_anywhere(
        ids in proptest::collection::vec(any::<i64>(), 0..5), resp3 in any::<bool>(),
    ) {
        use respproto::server::Reply;
        let recv = Reply::Array(ids.iter().map(|id| Reply::Array(vec![
            Reply::Int(*id), Reply::Int(id.wrapping_mul(7)), Reply::text("sender"), Reply::Bulk(b"body\r\n".to_vec()),
        ])).collect());
        let replies = [recv, Reply::Int(42), Reply::Nil, Reply::Error("NOQUEUE no such queue 'q'".into())];
        let input: Vec<u8> = replies.iter().flat_map(|r| r.to_bytes_as(resp3)).collect();
        for cut in 0..=input.len() {
            let got = client_read(&input, cut);
            prop_assert_eq!(got.len(), 4, "split at {}", cut);
            prop_assert_eq!(got[0].messages as usize, ids.len());
            prop_assert_eq!(got[0].lease, ids.first().map(|id| (*id, id.wrapping_mul(7))));
            prop_assert_eq!(got[1].integer, Some(42));
            prop_assert!(got[3].error);
        }
    }
}
