//! The `mwrelay` binary between a client and an echo server: each round trip
//! takes twice the delay longer, bytes arrive whole and in order, an end of
//! stream is passed on, and bad arguments are refused.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

struct Relay(Child);

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn echo_server() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    // Every connection is served (not just the test's own: a stray probe
    // of another program that was handed the same port must not use up
    // the server).
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => c.write_all(&buf[..n]).unwrap(),
                    }
                }
            });
        }
    });
    addr
}

fn relay(upstream: &str, delay: &str) -> (Relay, String) {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let child = Command::new(env!("CARGO_BIN_EXE_mwrelay"))
        .args(["--listen", &listen, "--upstream", upstream, "--delay", delay])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&listen).is_err() {
        assert!(Instant::now() < deadline, "mwrelay did not listen");
        thread::sleep(Duration::from_millis(20));
    }
    (Relay(child), listen)
}

/// The shortest of `rounds` round trips of one byte: what the path itself
/// costs, since a busy machine only ever adds to a round trip (a median would
/// carry the scheduler's delays into the comparison).
fn fastest_round_trip(addr: &str, rounds: usize) -> Duration {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut times = Vec::new();
    let mut b = [0u8; 1];
    for _ in 0..rounds {
        let t = Instant::now();
        s.write_all(b"x").unwrap();
        s.read_exact(&mut b).unwrap();
        times.push(t.elapsed());
    }
    times.into_iter().min().unwrap()
}

#[test]
fn a_round_trip_takes_twice_the_delay_longer_and_bytes_stay_in_order() {
    let echo = echo_server();
    let (_r, via) = relay(&echo, "20ms");
    let direct = fastest_round_trip(&echo, 40);
    let relayed = fastest_round_trip(&via, 20);
    let added = relayed.saturating_sub(direct);
    // Never less than the delay each way; and the fastest of 20 round trips
    // is 20 ms short of what a delay applied twice per direction (80 ms) or
    // a segment held back by Nagle's algorithm (40 ms more) would give: a
    // loaded machine would have to delay every one of them that much.
    assert!(added >= Duration::from_micros(39_900), "added {added:?}");
    assert!(added < Duration::from_millis(60), "added {added:?}");
    // A larger stream, written in pieces, comes back whole and in order.
    let mut s = TcpStream::connect(&via).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let writer = {
        let mut w = s.try_clone().unwrap();
        let data = data.clone();
        thread::spawn(move || {
            for chunk in data.chunks(7_000) {
                w.write_all(chunk).unwrap();
            }
            w.shutdown(std::net::Shutdown::Write).unwrap();
        })
    };
    let mut back = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.read_to_end(&mut back).unwrap();
    writer.join().unwrap();
    assert_eq!(back, data, "every byte, in order, then the end of the stream");
}

#[test]
fn bad_arguments_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_mwrelay"))
        .args(["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1", "--delay", "2 weeks"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("us, ms or s"));
    let out = Command::new(env!("CARGO_BIN_EXE_mwrelay"))
        .args(["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1", "--delay", "1ms", "--jitter", "2ms"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot exceed"));
}
