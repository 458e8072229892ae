//! End-to-end tests of what hostile or careless clients can do to the control socket and the
//! HTTP /metrics endpoint (issue 17, rows 1 and 3): another uid filling the metrics port,
//! slowloris clients, idle clients, and clients that send requests without reading answers.
//! Each drives a `ppa-vmm run` child as an attacker would; none asserts a duration.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use std::time::{Duration, Instant};

use common::vmm::{ctl, Vmm};
use serde_json::json;

/// How much the VMM's resident memory may grow while 50 clients send 2,000 `metrics`
/// requests each and read nothing (docs/operations.md, "Hostile and careless clients").
const RSS_GROWTH_BOUND_MIB: u64 = 32;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A VMM idling for two minutes with the metrics endpoint on a free port, and `extra` flags.
fn start(tag: &str, extra: &[&str]) -> (Vmm, u16) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = vec!["--workload", "idle:ms=120000", "--metrics-addr", &addr];
    args.extend_from_slice(extra);
    (Vmm::start(tag, &args), port)
}

/// One `GET /metrics`: the whole response, or `None` if the connection failed.
fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

/// Whether the other end closed `fd` (or reset it), without reading what it sent.
fn peer_closed(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: `p` is one valid pollfd; a zero timeout never blocks.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// The resident memory of process `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// A forked child holding TCP connections to the metrics port as uid and gid 65534
/// (`nobody`); killed and reaped on drop.
struct Holder {
    pid: libc::pid_t,
    /// How many connections the child opened.
    opened: u32,
}

impl Holder {
    /// Forks a child that drops to uid 65534, connects `n` times to 127.0.0.1:`port`, says
    /// how many connections it opened, and holds them until it is killed.
    fn start(port: u16, n: u32) -> Holder {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "this test runs a client as uid 65534 and needs root (CI runs as root)"
        );
        // Everything the child uses is made before fork: it may only make async-signal-safe
        // calls (the test harness has other threads).
        // SAFETY: sockaddr_in is plain old data; all zeroes is a valid value.
        let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_port = port.to_be();
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let mut fds = [0i32; 2];
        // SAFETY: `fds` has room for the two descriptors pipe writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (rd, wr) = (fds[0], fds[1]);
        let files = libc::rlimit {
            rlim_cur: u64::from(n) + 64,
            rlim_max: u64::from(n) + 64,
        };
        // SAFETY: fork has no preconditions; the child below makes only async-signal-safe
        // calls (setrlimit, setgroups, setgid, setuid, socket, connect, write, pause, _exit).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: each call gets valid pointers to data made before fork, or none; the
            // child never returns into the test harness.
            unsafe {
                libc::close(rd);
                let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &files);
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(65534) != 0
                    || libc::setuid(65534) != 0
                {
                    libc::_exit(3);
                }
                let mut opened: u32 = 0;
                for _ in 0..n {
                    let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                    if fd < 0 {
                        break;
                    }
                    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                    if libc::connect(fd, (&addr as *const libc::sockaddr_in).cast(), len) == 0 {
                        opened += 1;
                    } else {
                        libc::close(fd);
                    }
                }
                libc::write(wr, (&opened as *const u32).cast(), 4);
                loop {
                    libc::pause();
                }
            }
        }
        // SAFETY: `wr` is the parent's copy of the pipe's write end, used no more.
        unsafe { libc::close(wr) };
        let mut buf = [0u8; 4];
        // SAFETY: `rd` is the pipe's read end; from_raw_fd takes it over and closes it.
        let mut pipe = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(rd) };
        let mut holder = Holder { pid, opened: 0 };
        pipe.read_exact(&mut buf)
            .expect("the child says how many it opened");
        holder.opened = u32::from_ne_bytes(buf);
        holder
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // SAFETY: `pid` is this test's child; kill and waitpid take no pointers but status.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// Row 1: as another uid, open more idle TCP connections to the metrics port than any cap;
/// the owner's `ctl` still works, and so does a scrape.
#[test]
fn another_uid_filling_the_metrics_port_does_not_lock_the_owner_out() {
    let _g = common::serial();
    let (vmm, port) = start("uid-flood", &[]);
    let holder = Holder::start(port, 1100);
    assert!(
        holder.opened >= 1100,
        "uid 65534 opened {} connections",
        holder.opened
    );
    // Let the server accept them all.
    std::thread::sleep(Duration::from_millis(500));
    let o = ctl(&vmm.sock, &["version"]);
    assert!(
        o.status.success(),
        "ctl version with 1,100 idle HTTP connections held by another uid: {o:?}"
    );
    let reply = scrape(port).unwrap_or_default();
    assert!(
        reply.starts_with("HTTP/1.1 200 OK"),
        "a scrape among 1,100 idle connections: {:?}",
        reply.get(..80.min(reply.len()))
    );
    drop(holder);
    let (code, _) = vmm.shutdown();
    assert_eq!(code, 0);
}

/// Row 1: 200 slowloris HTTP connections and 20 on the control socket, each sending a byte a
/// second and never finishing a request, are all closed; the owner is served meanwhile.
#[test]
fn slowloris_connections_are_closed() {
    let _g = common::serial();
    let (vmm, port) = start("slowloris", &["--client-timeout", "2"]);
    let head = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
    let line = br#"{"id":1,"cmd":"version","pad":""#.to_vec();
    enum Slow {
        Http(TcpStream),
        Api(UnixStream),
    }
    let mut open: Vec<(Slow, usize)> = Vec::new();
    for _ in 0..200 {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_nonblocking(true).unwrap();
        open.push((Slow::Http(s), 0));
    }
    for _ in 0..20 {
        let s = UnixStream::connect(&vmm.sock).unwrap();
        s.set_nonblocking(true).unwrap();
        open.push((Slow::Api(s), 0));
    }
    let t0 = Instant::now();
    let deadline = Duration::from_secs(30);
    let mut answers = Vec::new();
    let mut served_meanwhile = false;
    while !open.is_empty() && t0.elapsed() < deadline {
        if !served_meanwhile && t0.elapsed() >= Duration::from_secs(1) {
            // Every slow connection is open and has sent a byte or more: the owner is served.
            let o = ctl(&vmm.sock, &["version"]);
            assert!(
                o.status.success(),
                "ctl version among slowloris clients: {o:?}"
            );
            let reply = scrape(port).unwrap_or_default();
            assert!(
                reply.starts_with("HTTP/1.1 200"),
                "a scrape among slowloris clients: {:?}",
                reply.get(..80.min(reply.len()))
            );
            served_meanwhile = true;
        }
        open.retain_mut(|(s, sent)| {
            let (fd, byte) = match s {
                Slow::Http(t) => (t.as_raw_fd(), head[*sent % head.len()]),
                Slow::Api(u) => (u.as_raw_fd(), line[*sent % line.len()]),
            };
            if peer_closed(fd) {
                let mut got = Vec::new();
                let _ = match s {
                    Slow::Http(t) => t.read_to_end(&mut got),
                    Slow::Api(u) => u.read_to_end(&mut got),
                };
                answers.push(got);
                return false;
            }
            let w = match s {
                Slow::Http(t) => t.write(&[byte]),
                Slow::Api(u) => u.write(&[byte]),
            };
            *sent += 1;
            w.is_ok()
        });
        std::thread::sleep(Duration::from_secs(1));
    }
    eprintln!(
        "slowloris: {} of 220 connections left open after {:.1} s",
        open.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(
        open.is_empty(),
        "{} slowloris connections still open after {deadline:?}",
        open.len()
    );
    for a in &answers {
        assert!(
            a.is_empty() || a.starts_with(b"HTTP/1.1 408"),
            "a slowloris client got {:?}",
            String::from_utf8_lossy(a)
        );
    }
    assert!(ctl(&vmm.sock, &["version"]).status.success());
    assert!(scrape(port).unwrap_or_default().starts_with("HTTP/1.1 200"));
    // The exporter shows the listeners' counters: past the render interval (100 ms), a new
    // text counts every slowloris connection served and now closed.
    std::thread::sleep(Duration::from_millis(300));
    let text = scrape(port).unwrap_or_default();
    let sample = |family: &str, listener: &str| -> u64 {
        let label = format!("listener=\"{listener}\"}} ");
        text.lines()
            .find(|l| l.starts_with(&format!("{family}{{")) && l.contains(&label))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {family} for {listener} in the scrape"))
    };
    assert!(sample("ppa_api_connections_total", "http") >= 200);
    assert!(sample("ppa_api_connections_total", "socket") >= 20);
    assert_eq!(sample("ppa_api_clients", "socket"), 0);
    assert_eq!(sample("ppa_api_clients", "http"), 1, "this scrape alone");
    let (code, _) = vmm.shutdown();
    assert_eq!(code, 0);
}

/// A control connection that says nothing is closed after the idle timeout; a subscriber
/// waiting for events that do not come is not idle.
#[test]
fn idle_connections_are_closed_but_subscribers_stay() {
    let _g = common::serial();
    let (vmm, _) = start("idle", &["--idle-timeout", "1"]);
    let mut sub = vmm.connect();
    sub.ok(json!({"id": 1, "cmd": "subscribe", "events": ["vm-exit"]}));
    let silent = UnixStream::connect(&vmm.sock).unwrap();
    let t0 = Instant::now();
    while !peer_closed(silent.as_raw_fd()) && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        peer_closed(silent.as_raw_fd()),
        "a silent connection is still open after {:?}",
        t0.elapsed()
    );
    eprintln!(
        "idle: a silent connection was closed after {:?}",
        t0.elapsed()
    );
    // The subscriber, quiet for longer, is still served.
    assert_eq!(sub.ok(json!({"id": 2, "cmd": "version"}))["api"], json!(1));
    let (code, _) = vmm.shutdown();
    assert_eq!(code, 0);
}

/// Row 3: 50 clients each send 2,000 `metrics` requests and read nothing. The VMM's RSS
/// stays within the documented bound, `ctl version` is still answered (its latency is
/// printed, not asserted), and the clients are dropped.
#[test]
fn clients_that_do_not_read_are_bounded_and_dropped() {
    let _g = common::serial();
    let (vmm, _) = start("noread", &["--client-timeout", "3"]);
    // Let the VMM settle: one scrape and one version, as the flood will ask.
    assert!(ctl(&vmm.sock, &["metrics"]).status.success());
    std::thread::sleep(Duration::from_millis(300));
    let rss0 = rss_kib(vmm.pid());
    let requests = b"{\"cmd\":\"metrics\"}\n".repeat(2000);
    let mut flood = Vec::new();
    for _ in 0..50 {
        let mut s = UnixStream::connect(&vmm.sock).unwrap();
        s.write_all(&requests).unwrap();
        flood.push(s);
    }
    let t0 = Instant::now();
    let (mut peak, mut worst) = (rss0, Duration::ZERO);
    let mut latencies = Vec::new();
    while t0.elapsed() < Duration::from_secs(5) {
        let t = Instant::now();
        let o = ctl(&vmm.sock, &["version"]);
        assert!(o.status.success(), "ctl version during the flood: {o:?}");
        worst = worst.max(t.elapsed());
        latencies.push(t.elapsed());
        peak = peak.max(rss_kib(vmm.pid()));
        std::thread::sleep(Duration::from_millis(100));
    }
    latencies.sort();
    eprintln!(
        "no-read flood: RSS {} -> peak {} MiB; ctl version (a whole `ppa-vmm ctl` process) median {:?}, worst {:?}",
        rss0 / 1024,
        peak / 1024,
        latencies[latencies.len() / 2],
        worst
    );
    assert!(
        peak - rss0 < RSS_GROWTH_BOUND_MIB * 1024,
        "RSS grew from {} to {} KiB (bound: {RSS_GROWTH_BOUND_MIB} MiB)",
        rss0,
        peak
    );
    // They never read: the server drops them (client timeout 3 s).
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs(30)
        && !flood.iter().all(|s| peer_closed(s.as_raw_fd()))
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let still = flood.iter().filter(|s| !peer_closed(s.as_raw_fd())).count();
    assert_eq!(
        still, 0,
        "{still} of 50 clients that never read are still connected"
    );
    assert!(ctl(&vmm.sock, &["version"]).status.success());
    let (code, _) = vmm.shutdown();
    assert_eq!(code, 0);
}
