//! The host view end to end: VMs registered in a run directory, `host list` and `host serve`
//! over them, a VM killed and cleaned, one that never answers, a run directory refused,
//! systemd's readiness message.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::prom::{free_port, host_serve, promtool_accepts, Killed};
use common::vmm::{bin, connect_when_up, temp_dir, Conn};
use serde_json::{json, Value};

/// A tiny idle VM named `name` in `dir`, its socket up.
fn start(dir: &Path, name: &str) -> Killed {
    common::require_kvm();
    let child = Command::new(bin())
        .args([
            "run",
            "--guest",
            "tiny",
            "--vcpus",
            "1",
            "--memory-mib",
            "16",
        ])
        .args(["--prefault", "false", "--workload", "idle:ms=120000"])
        .args(["--report", "none", "--max-runtime", "120", "--name", name])
        .arg("--run-dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(connect_when_up(&dir.join(format!("{name}.sock"))));
    Killed(child)
}

fn host(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(bin()).arg("host").args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn list(dir: &Path) -> Vec<Value> {
    let (code, out, err) = host(&["list", "--json", "--run-dir", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str::<Value>(&out)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn three_vms_are_listed_with_their_pids_and_a_killed_one_leaves_nothing_behind() {
    let d = temp_dir("host-list");
    let dir = d.as_path().join("run");
    std::fs::create_dir(&dir).unwrap();
    let mut vms: Vec<(String, Killed)> = ["a", "b", "c"]
        .iter()
        .map(|n| (n.to_string(), start(&dir, n)))
        .collect();
    let t0 = Instant::now();
    let rows = list(&dir);
    let took = t0.elapsed();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    for ((name, vm), row) in vms.iter().zip(&rows) {
        assert_eq!(row["pid"], json!(vm.0.id()), "{row}");
        assert_eq!(row["state"], json!("running"), "{row}");
        assert_eq!(row["vcpus"], json!(1));
        let sock = dir.join(format!("{name}.sock"));
        assert_eq!(row["socket"], json!(sock));
        // The VM's own figures, read right after: its uptime a little later than the list's.
        let mut c = Conn::new(std::os::unix::net::UnixStream::connect(&sock).unwrap());
        let own = c.call(json!({"id": 1, "cmd": "stats"}));
        let own_up = own["result"]["vm"]["uptime_ns"].as_u64().unwrap();
        let listed = row["uptime_ns"].as_u64().unwrap();
        assert!(
            own_up >= listed && own_up - listed < took.as_nanos() as u64 + 100_000_000,
            "{own_up} vs {listed}"
        );
    }
    // Kill b as a crash would: its descriptor and socket stay until the next look.
    let (_, mut b) = vms.remove(1);
    b.0.kill().unwrap();
    b.0.wait().unwrap();
    assert!(dir.join("b.json").exists() && dir.join("b.sock").exists());
    let rows = list(&dir);
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "c"]);
    assert!(
        !dir.join("b.json").exists(),
        "the stale descriptor is removed"
    );
    assert!(!dir.join("b.sock").exists(), "the stale socket is removed");
    assert!(dir.join("a.sock").exists() && dir.join("c.json").exists());
    // A second VM may not take a live one's name.
    let o = Command::new(bin())
        .args([
            "run",
            "--guest",
            "tiny",
            "--report",
            "none",
            "--name",
            "a",
            "--run-dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("already running"),
        "{o:?}"
    );
}

#[test]
fn a_vm_that_accepts_and_never_answers_is_listed_as_not_answering() {
    let d = temp_dir("host-hung");
    let dir = d.as_path().join("run");
    std::fs::create_dir(&dir).unwrap();
    let _a = start(&dir, "a");
    // A "VMM" (this test process) whose socket accepts and never answers.
    let sock = dir.join("hung.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let hung = ppa_vmm_client::rundir::Descriptor::of_self("hung", 1, Some(sock.clone()));
    std::fs::write(dir.join("hung.json"), serde_json::to_string(&hung).unwrap()).unwrap();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let held = listener.accept();
        let _ = wait.recv();
        drop(held);
    });
    let (code, out, err) = host(&[
        "list",
        "--json",
        "--timeout-ms",
        "300",
        "--run-dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
    let states: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [("a", "running"), ("hung", "not-answering")]);
    assert_eq!(rows[1]["pid"], json!(std::process::id()));
    assert!(
        rows[1]["error"]
            .as_str()
            .unwrap()
            .contains("no answer within 300 ms"),
        "{out}"
    );
    // The table says so too.
    let (code, text, _) = host(&[
        "list",
        "--timeout-ms",
        "100",
        "--run-dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0);
    assert!(
        text.lines()
            .any(|l| l.starts_with("hung ") && l.contains("not-answering")),
        "{text}"
    );
    // Issue 39, item 10: the `not-answering` row keeps the columns in line, and its uptime
    // is unknown, not 0.0.
    let socket_at = text.lines().next().unwrap().find("SOCKET").unwrap();
    for l in text.lines().skip(1).filter(|l| !l.starts_with('(')) {
        assert_eq!(l.find(dir.to_str().unwrap()), Some(socket_at), "{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("hung ") && l.contains(" unknown ")),
        "{text}"
    );
    assert_eq!(rows[1]["uptime_ns"], Value::Null, "{out}");
    done.send(()).unwrap();
    holder.join().unwrap();
}

/// Issue 39, item 5: only a world-writable run directory was refused; in a group-writable one
/// a member of the group moved a VM's socket aside and bound their own. Both are refused with
/// a sentence naming the directory, its owner and its mode, by `run` and by `host`.
#[test]
fn a_run_directory_others_may_write_in_is_refused_with_a_sentence() {
    let d = temp_dir("host-ww");
    let dir = d.as_path().join("run");
    std::fs::create_dir(&dir).unwrap();
    for (mode, words) in [(0o777, "world-writable"), (0o770, "group-writable")] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let o = Command::new(bin())
            .args(["run", "--guest", "tiny", "--report", "none"])
            .args(["--max-runtime", "1", "--workload", "idle:ms=100"])
            .args(["--name", "x", "--run-dir"])
            .arg(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{mode:o}: {err}");
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        for part in [
            dir.display().to_string(),
            format!("owner uid {me}"),
            format!("mode {mode:o}"),
            words.to_string(),
        ] {
            assert!(err.contains(&part), "{mode:o}: {part:?} in {err}");
        }
        let (code, _, err) = host(&["list", "--run-dir", dir.to_str().unwrap()]);
        assert_eq!(code, 2);
        assert!(err.contains(words), "{err}");
    }
}

/// Makes a FIFO at `path`; nobody writes it, so whoever opens it to read waits in `open`.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Issue 39, item 5: `mkfifo victim2.json` in the run directory hung a VMM named victim2 at
/// start, in `open`, for good. The descriptor is opened O_NONBLOCK | O_NOFOLLOW and must be a
/// regular file: the VMM refuses with a sentence at once (exit code 2), and `host list`
/// counts it as unreadable.
#[test]
fn a_fifo_planted_as_a_descriptor_is_refused_with_a_sentence_at_once() {
    common::require_kvm();
    let d = temp_dir("host-fifo");
    let dir = d.as_path().join("run");
    std::fs::create_dir(&dir).unwrap();
    mkfifo(&dir.join("victim2.json"));
    let mut child = Command::new(bin())
        .args(["run", "--guest", "tiny", "--report", "none"])
        .args(["--max-runtime", "1", "--workload", "idle:ms=100"])
        .args(["--name", "victim2", "--run-dir"])
        .arg(&dir)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the VMM blocked for 10 s on a FIFO planted as its descriptor");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("victim2.json in the run directory is a FIFO, not a regular file"),
        "{err}"
    );
    let (code, out, err) = host(&["list", "--run-dir", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 unreadable"), "{out}");
}

/// Issue 39, item 6: a dead VMM's descriptor whose `socket` named a regular file of the run
/// directory (`precious.txt`, or a regular file called `st2.sock`) made `host list` delete
/// it. Only a socket (by `lstat`) of the descriptor's owner inside the directory is removed;
/// the others are left alone, and the list says so.
#[test]
fn stale_cleaning_leaves_what_is_not_a_dead_socket_and_says_so() {
    let d = temp_dir("host-stale");
    let dir = d.as_path().join("run");
    std::fs::create_dir(&dir).unwrap();
    let plant = |name: &str, socket: &Path| {
        let mut dead = ppa_vmm_client::rundir::Descriptor::of_self(name, 1, Some(socket.into()));
        dead.proc_start += 1;
        std::fs::write(
            dir.join(format!("{name}.json")),
            serde_json::to_string(&dead).unwrap(),
        )
        .unwrap();
    };
    let precious = dir.join("precious.txt");
    std::fs::write(&precious, b"keep me").unwrap();
    let st2 = dir.join("st2.sock");
    std::fs::write(&st2, b"a regular file").unwrap();
    plant("precious", &precious);
    plant("st2", &st2);
    let (code, out, err) = host(&["list", "--run-dir", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
    assert_eq!(std::fs::read(&st2).unwrap(), b"a regular file");
    for (name, path) in [("precious", &precious), ("st2", &st2)] {
        assert!(
            out.contains(&format!(
                "stale entry {name}: its socket path {} was skipped, not removed: it is a \
                 regular file, not a socket",
                path.display()
            )),
            "{out}"
        );
    }
    assert!(out.contains("2 stale entries removed"), "{out}");
    assert!(!dir.join("precious.json").exists() && !dir.join("st2.json").exists());
    // With --json the rows stay one JSON array on stdout; the note goes to stderr.
    plant("precious", &precious);
    let (code, out, err) = host(&["list", "--json", "--run-dir", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "[]");
    assert!(
        err.contains("stale entry precious: its socket path"),
        "{err}"
    );
    assert!(precious.exists());
}

#[test]
fn host_serve_gives_every_vms_series_with_its_label_and_drops_a_vm_that_went_away() {
    let d = temp_dir("host-serve");
    let dir = d.as_path().join("run");
    std::fs::create_dir(&dir).unwrap();
    let a = start(&dir, "a");
    let mut b = start(&dir, "b");
    let port = free_port();
    let _serve = host_serve(&dir, port);
    let mut body = None;
    for _ in 0..200 {
        if let Some((status, text)) = common::prom::get(port, "/metrics") {
            assert_eq!(status, "HTTP/1.1 200 OK");
            body = Some(text);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = body.expect("host serve answers");
    promtool_accepts(&text);
    for vm in ["a", "b"] {
        assert!(
            text.contains(&format!("ppa_vm_uptime_seconds{{vm=\"{vm}\"}}")),
            "{vm}"
        );
        assert!(text.contains(&format!("ppa_host_vm_up{{vm=\"{vm}\"}} 1")));
        assert!(text.contains(&format!(
            "kubevirt_vmi_vcpu_seconds_total{{name=\"{vm}\",namespace=\"\",id=\"0\",state=\"running\"}}"
        )));
        assert!(text.contains(&format!(
            "libvirt_domain_vcpu_delay_seconds_total{{domain=\"{vm}\",vcpu=\"0\"}}"
        )));
    }
    assert_eq!(
        text.matches("# TYPE ppa_vm_uptime_seconds gauge").count(),
        1
    );
    assert!(text.contains("ppa_host_vms 2\n"));
    // b dies during the scrapes: the next scrape succeeds without it.
    b.0.kill().unwrap();
    b.0.wait().unwrap();
    let (status, text) = common::prom::get(port, "/metrics").unwrap();
    assert_eq!(status, "HTTP/1.1 200 OK");
    promtool_accepts(&text);
    assert!(
        !text.contains("vm=\"b\"") && !text.contains("name=\"b\""),
        "{text}"
    );
    assert!(text.contains("ppa_vm_uptime_seconds{vm=\"a\"}"));
    assert!(text.contains("ppa_host_vms 1\n"));
    drop(a);
}

/// Issue 39, item 10: a "VMM" answering `stats` with a 64 MiB line made `host list` take
/// 70 MB before it called that VM unreachable. A line is read only up to a bound (4 MiB while
/// `stats` is awaited): past it the VM's row says so, and the list's peak memory stays small.
#[test]
fn a_64_mib_answer_line_is_that_vms_error_and_the_list_stays_small() {
    let d = temp_dir("host-huge");
    let dir = d.as_path().join("run");
    std::fs::create_dir(&dir).unwrap();
    let sock = dir.join("huge.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let huge = ppa_vmm_client::rundir::Descriptor::of_self("huge", 1, Some(sock.clone()));
    std::fs::write(dir.join("huge.json"), serde_json::to_string(&huge).unwrap()).unwrap();
    let server = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        let mut first = [0u8; 256];
        let _ = std::io::Read::read(&mut c, &mut first);
        let mut line = b"{\"id\":1,\"ok\":true,\"result\":\"".to_vec();
        line.resize(64 << 20, b'x');
        let _ = std::io::Write::write_all(&mut c, &line);
    });
    // Reaped by wait4 below, which gives its resource use as well.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(bin())
        .args([
            "host",
            "list",
            "--json",
            "--timeout-ms",
            "20000",
            "--run-dir",
        ])
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.unwrap(), &mut out).unwrap();
    let mut status = 0;
    // SAFETY: rusage is plain old data; all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our unwaited child; `status` and `usage` are valid for wait4 to fill.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid);
    server.join().unwrap();
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows[0]["state"], json!("unreachable"), "{out}");
    assert_eq!(rows[0]["uptime_ns"], Value::Null, "{out}");
    let error = rows[0]["error"].as_str().unwrap();
    assert!(error.contains("longer than 4194304 bytes"), "{error}");
    let peak_mib = usage.ru_maxrss / 1024;
    assert!(
        peak_mib < 24,
        "host list peaked at {peak_mib} MiB for a 64 MiB answer line"
    );
}

/// A forked child, as uid and gid 65534 (`nobody`), holding `slow` TCP connections to
/// 127.0.0.1:`port` that sent a request line and then send one byte a second, and `silent`
/// ones that send nothing; killed and reaped on drop.
struct Hostile {
    pid: libc::pid_t,
}

impl Hostile {
    fn start(port: u16, slow: usize, silent: usize) -> Hostile {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "this test runs clients as uid 65534 and needs root"
        );
        // Everything the child uses is made before fork: it may only make async-signal-safe
        // calls (the test harness has other threads).
        // SAFETY: sockaddr_in is plain old data; all zeroes is a valid value.
        let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_port = port.to_be();
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let line = b"GET /metrics HTTP/1.1\r\n";
        let mut fds = [0i32; 2];
        // SAFETY: `fds` has room for the two descriptors pipe writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (rd, wr) = (fds[0], fds[1]);
        let mut socks = vec![-1i32; slow + silent];
        let second = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: fork has no preconditions; the child below makes only async-signal-safe
        // calls (setgroups, setgid, setuid, socket, connect, write, nanosleep, pause, _exit).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: each call gets valid pointers to data made before fork, or none; the
            // child never returns into the test harness.
            unsafe {
                libc::close(rd);
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(65534) != 0
                    || libc::setuid(65534) != 0
                {
                    libc::_exit(3);
                }
                let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                for (i, fd) in socks.iter_mut().enumerate() {
                    *fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                    if *fd < 0
                        || libc::connect(*fd, (&addr as *const libc::sockaddr_in).cast(), len) != 0
                    {
                        libc::_exit(4);
                    }
                    if i < slow {
                        libc::write(*fd, line.as_ptr().cast(), line.len());
                    }
                }
                libc::write(wr, b"r".as_ptr().cast(), 1);
                for _ in 0..60 {
                    libc::nanosleep(&second, std::ptr::null_mut());
                    for fd in &socks[..slow] {
                        libc::send(*fd, b"X".as_ptr().cast(), 1, libc::MSG_NOSIGNAL);
                    }
                }
                loop {
                    libc::pause();
                }
            }
        }
        // SAFETY: `wr` is the parent's copy of the pipe's write end, used no more.
        unsafe { libc::close(wr) };
        // SAFETY: `rd` is the pipe's read end; from_raw_fd takes it over and closes it.
        let mut pipe = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(rd) };
        let h = Hostile { pid };
        let mut buf = [0u8; 1];
        std::io::Read::read_exact(&mut pipe, &mut buf)
            .expect("the child connects as uid 65534 and says so");
        h
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        // SAFETY: `pid` is this test's child; kill and waitpid take no pointers but status.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// Issue 39, item 4: as another user, 50 TCP connections that send a request line and then
/// one byte a second, and 50 that send nothing, kept every root scrape of `host serve` at 503
/// (it served 8 connections, each with a 2 s read timeout that every byte restarted). Now each
/// head is due 2 s after its accept and a new connection evicts the oldest unfinished head:
/// root's scrape answers 200 (the waiting bound is the client's timeout, 3 s).
#[test]
fn slow_and_silent_connections_of_another_uid_do_not_keep_roots_scrape_out() {
    let d = temp_dir("host-slow");
    let dir = d.as_path().join("run");
    std::fs::create_dir(&dir).unwrap();
    let _a = start(&dir, "a");
    let port = free_port();
    let _serve = host_serve(&dir, port);
    let (status, _) = common::prom::metrics_when_up(port);
    assert_eq!(status, "HTTP/1.1 200 OK");
    let _hostile = Hostile::start(port, 50, 50);
    for round in 0..3 {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        std::io::Write::write_all(&mut s, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut text = String::new();
        let read = std::io::Read::read_to_string(&mut s, &mut text);
        let status = text.lines().next().unwrap_or("");
        assert_eq!(
            status, "HTTP/1.1 200 OK",
            "scrape {round} beside 100 hostile connections: {read:?}"
        );
        assert!(text.contains("ppa_host_vm_up{vm=\"a\"} 1"), "{text}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn ready_arrives_on_the_notify_socket_after_the_vcpus_start() {
    common::require_kvm();
    let d = temp_dir("host-notify");
    let notify = d.as_path().join("notify");
    let server = UnixDatagram::bind(&notify).unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let sock = d.as_path().join("api.sock");
    let child = Killed(
        Command::new(bin())
            .args([
                "run",
                "--guest",
                "tiny",
                "--vcpus",
                "2",
                "--workload",
                "idle:ms=60000",
            ])
            .args(["--report", "none", "--max-runtime", "60", "--api-sock"])
            .arg(&sock)
            .env("NOTIFY_SOCKET", &notify)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut buf = [0u8; 512];
    let n = server.recv(&mut buf).expect("a message on NOTIFY_SOCKET");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    assert!(msg.contains("STATUS=running: 2 vCPUs"), "{msg}");
    assert!(msg.contains(&format!("MAINPID={}", child.0.id())), "{msg}");
    // When READY=1 came, the socket answered and every vCPU had started.
    let mut c = Conn::new(std::os::unix::net::UnixStream::connect(&sock).unwrap());
    let threads = c.call(json!({"id": 1, "cmd": "threads"}));
    for v in threads["result"]["vcpus"].as_array().unwrap() {
        assert_ne!(v["state"], json!("created"), "{threads}");
        assert_ne!(v["host_tid"], json!(0));
    }
    c.call(json!({"id": 2, "cmd": "shutdown"}));
    let n = server.recv(&mut buf).expect("STOPPING=1");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
}
