//! `host serve`'s connection handling on a real listener, with a scrape that returns a fixed
//! text: slow and silent clients, the head deadline, eviction, the answers.

use std::net::SocketAddr;

use super::*;

/// A listener on a free loopback port served by [`Listen`] on a thread of its own (it ends
/// with the test process); its address and counts.
fn serve() -> (SocketAddr, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let scrape: Arc<ScrapeFn> = Arc::new(|| Ok("ppa_host_vms 0\n".to_string()));
    let l = Listen::new(listener, scrape).unwrap();
    let counts = Arc::clone(&l.counts);
    std::thread::spawn(move || l.run());
    (addr, counts)
}

/// Sends `request` and reads the whole answer (the server closes after it); its status line.
fn ask(addr: SocketAddr, request: &str, limit: Duration) -> io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(limit))?;
    s.write_all(request.as_bytes())?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text)
}

fn status(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

#[test]
fn the_oldest_unfinished_head_is_the_one_evicted() {
    let t = Instant::now();
    let at = |ms| t + Duration::from_millis(ms);
    assert_eq!(eviction_victim(&[at(30), at(10), at(20)]), Some(1));
    assert_eq!(eviction_victim(&[]), None);
}

/// Issue 39, item 4: 50 connections that sent a request line and then a byte a second, or 50
/// that sent nothing, kept every scrape at 503 (8 connections served, a 2 s read timeout that
/// each byte restarted). With 100 of both holding more than every slot, a scrape still
/// answers 200: a new connection evicts the oldest unfinished head.
#[test]
fn slow_and_silent_connections_do_not_keep_a_scrape_out() {
    let (addr, counts) = serve();
    let mut held = Vec::new();
    for i in 0..100 {
        let mut s = TcpStream::connect(addr).unwrap();
        if i % 2 == 0 {
            s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
        }
        held.push(s);
    }
    let slow: Vec<TcpStream> = held
        .iter()
        .step_by(2)
        .map(|s| s.try_clone().unwrap())
        .collect();
    let dripping = std::thread::spawn(move || {
        for _ in 0..3 {
            std::thread::sleep(Duration::from_secs(1));
            for mut s in &slow {
                let _ = s.write_all(b"X");
            }
        }
    });
    // The waiting bound is the client's: 3 s.
    let answer = ask(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(3),
    )
    .unwrap();
    assert_eq!(status(&answer), "HTTP/1.1 200 OK", "{answer}");
    assert!(answer.ends_with("\r\n\r\nppa_host_vms 0\n"), "{answer}");
    assert!(
        counts.evicted.load(Ordering::Relaxed) >= 100 + 1 - MAX_CONNS,
        "{counts:?}"
    );
    dripping.join().unwrap();
    drop(held);
}

/// The head is due [`HEAD_DEADLINE`] after the accept: a byte every 200 ms does not keep a
/// connection past it (a read timeout restarted by each byte did).
#[test]
fn a_head_is_due_from_the_accept_not_from_the_last_byte() {
    let (addr, counts) = serve();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    let t0 = Instant::now();
    let mut got = Vec::new();
    while t0.elapsed() < HEAD_DEADLINE * 4 {
        let _ = s.write_all(b"X");
        let mut buf = [0u8; 256];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert_eq!(status(&text), "HTTP/1.1 408 Request Timeout", "{text}");
    assert_eq!(counts.timed_out.load(Ordering::Relaxed), 1);
}

#[test]
fn head_and_other_requests_are_answered_as_the_vmm_answers_them() {
    let (addr, _) = serve();
    let limit = Duration::from_secs(5);
    let head = ask(addr, "HEAD /metrics HTTP/1.1\r\n\r\n", limit).unwrap();
    assert_eq!(status(&head), "HTTP/1.1 200 OK");
    assert!(
        head.ends_with("Content-Length: 15\r\nConnection: close\r\n\r\n"),
        "{head}"
    );
    let other = ask(addr, "GET / HTTP/1.1\r\n\r\n", limit).unwrap();
    assert_eq!(status(&other), "HTTP/1.1 404 Not Found");
    let post = ask(addr, "POST /metrics HTTP/1.0\n\n", limit).unwrap();
    assert_eq!(status(&post), "HTTP/1.1 405 Method Not Allowed");
    let big = format!(
        "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(MAX_HTTP_HEAD)
    );
    let too_big = ask(addr, &big, limit).unwrap_or_default();
    assert!(
        too_big.is_empty() || status(&too_big) == "HTTP/1.1 431 Request Header Fields Too Large",
        "{too_big}"
    );
}
