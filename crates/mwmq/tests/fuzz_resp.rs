//! The RESP request parser under generated input (proptest; a failing case
//! is shrunk and kept in `proptest-regressions/` beside this file, and run
//! first from then on): random bytes never panic it, whatever the chunks they
//! arrive in, and the chunks never change what it reads; generated requests
//! — arrays of bulk strings and inline commands — come back as the
//! arguments they were made of, split at every byte boundary.

use mwmq::resp::{Request, RequestParser};
use proptest::prelude::*;

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
