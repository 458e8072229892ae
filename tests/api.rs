//! End-to-end tests of the control socket: `ppa-vmm run --api-sock` on the tiny guest, driven
//! as a client would (raw JSON Lines, `ppa-vmm ctl`, `ppa-vmm top`).

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::vmm::{bin, ctl, Conn, Vmm};
use ppa_vmm_api::{Stats, VcpuSummary, VcpuTimes};
use serde_json::json;

fn never_decrease(a: &VcpuSummary, b: &VcpuSummary) {
    let pairs = [
        ("wall", a.wall_ns, b.wall_ns),
        ("used", a.used_ns, b.used_ns),
        ("guest", a.guest_ns, b.guest_ns),
        ("vmm", a.vmm_ns, b.vmm_ns),
        ("steal", a.steal_ns, b.steal_ns),
        ("idle", a.idle_ns, b.idle_ns),
        ("paused", a.paused_ns, b.paused_ns),
        ("exits", a.total_exits(), b.total_exits()),
    ];
    for (name, x, y) in pairs {
        assert!(y >= x, "vCPU {}: {name} went from {x} to {y}", a.id);
    }
}

/// A VMM running two `mixed` vCPUs for a minute, and a connection to it, 300 ms after start
/// (so that every vCPU has run and exited).
fn running(tag: &str) -> (Vmm, Conn) {
    let vmm = Vmm::start(tag, &["--vcpus", "2", "--workload", "mixed:ms=60000"]);
    let c = vmm.connect();
    std::thread::sleep(Duration::from_millis(300));
    (vmm, c)
}

#[test]
fn version_says_api_1() {
    let _g = common::serial();
    let (_vmm, mut c) = running("version");
    let v = c.ok(json!({"id": 1, "cmd": "version"}));
    assert_eq!(v["api"], json!(1));
}

#[test]
fn live_stats_show_every_vcpu_and_never_decrease() {
    let _g = common::serial();
    let (_vmm, mut c) = running("stats");
    // (That they hold the identity is the accuracy target's.)
    let a = c.stats();
    assert_eq!(a.vcpus.len(), 2);
    assert_eq!(a.vm.state, ppa_vmm_api::VmState::Running);
    for v in &a.vcpus {
        assert!(v.wall_ns > 0 && v.host_tid > 0, "{v:?}");
    }
    std::thread::sleep(Duration::from_millis(50));
    let b = c.stats();
    for (x, y) in a.vcpus.iter().zip(&b.vcpus) {
        never_decrease(x, y);
    }
    assert!(b.vcpus[0].wall_ns > a.vcpus[0].wall_ns, "time moves");
}

#[test]
fn vcpu_gives_one_vcpus_times() {
    let _g = common::serial();
    let (_vmm, mut c) = running("vcpu");
    let one: VcpuTimes =
        serde_json::from_value(c.ok(json!({"id": 2, "cmd": "vcpu", "vcpu": 1}))).unwrap();
    assert_eq!(one.id, 1);
}

#[test]
fn histogram_in_json_and_in_text() {
    let _g = common::serial();
    let (_vmm, mut c) = running("histogram");
    let h = c.ok(json!({"id": 3, "cmd": "histogram", "name": "guest_run"}));
    assert!(h["histogram"]["count"].as_u64().unwrap() > 0, "{h}");
    let t = c.ok(
        json!({"id": 4, "cmd": "histogram", "name": "exit_handling", "vcpu": 0, "format": "text"}),
    );
    assert!(t.as_str().unwrap().starts_with("# histogram exit_handling"));
}

#[test]
fn threads_lists_every_vcpu_thread() {
    let _g = common::serial();
    let (_vmm, mut c) = running("threads");
    let th = c.ok(json!({"id": 5, "cmd": "threads"}));
    assert_eq!(th["vcpus"].as_array().unwrap().len(), 2);
    assert!(th["vcpus"][0]["host_tid"].as_i64().unwrap() > 0);
}

#[test]
fn set_level_changes_the_accounting_level() {
    let _g = common::serial();
    let (_vmm, mut c) = running("level");
    c.ok(json!({"id": 6, "cmd": "set-level", "level": "full"}));
    assert_eq!(c.stats().vm.level, ppa_vmm_api::Level::Full);
}

#[test]
fn set_thresholds_changes_the_thresholds() {
    let _g = common::serial();
    let (_vmm, mut c) = running("thresholds");
    c.ok(json!({"id": 7, "cmd": "set-thresholds", "guest_run_ns": 1_000_000}));
    assert_eq!(c.stats().vm.thresholds.guest_run_ns, 1_000_000);
}

#[test]
fn metrics_in_the_prometheus_text_format() {
    let _g = common::serial();
    let (_vmm, mut c) = running("metrics");
    let m = c.ok(json!({"id": 8, "cmd": "metrics"}));
    assert!(m.as_str().unwrap().contains("ppa_vcpu_used_seconds_total{"));
}

#[test]
fn reset_restarts_the_counters() {
    let _g = common::serial();
    let (_vmm, mut c) = running("reset");
    // Counters restart (the only time they may decrease).
    std::thread::sleep(Duration::from_millis(200));
    let before = c.stats();
    c.ok(json!({"id": 9, "cmd": "reset"}));
    let after = c.stats();
    for (x, y) in before.vcpus.iter().zip(&after.vcpus) {
        assert!(y.wall_ns < x.wall_ns, "vCPU {}: reset restarts wall", x.id);
    }
}

#[test]
fn pause_freezes_used_time_and_resume_runs_again() {
    let _g = common::serial();
    let (vmm, mut c) = running("pause");
    // Pause: used_ns frozen, paused_ns growing.
    c.ok(json!({"id": 10, "cmd": "pause"}));
    std::thread::sleep(Duration::from_millis(100));
    let p1 = c.stats();
    assert_eq!(p1.vm.state, ppa_vmm_api::VmState::Paused);
    std::thread::sleep(Duration::from_millis(200));
    let p2 = c.stats();
    for (x, y) in p1.vcpus.iter().zip(&p2.vcpus) {
        assert_eq!(x.used_ns, y.used_ns, "vCPU {}: used_ns frozen", x.id);
        assert!(
            y.paused_ns >= x.paused_ns + 150_000_000,
            "vCPU {}: paused_ns {} -> {}",
            x.id,
            x.paused_ns,
            y.paused_ns
        );
    }
    c.ok(json!({"id": 11, "cmd": "resume"}));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(c.stats().vm.state, ppa_vmm_api::VmState::Running);
    // The report keeps the time paused.
    let (code, report) = vmm.shutdown();
    assert_eq!(code, 0);
    for v in report["vcpus"].as_array().unwrap() {
        assert!(v["paused_ns"].as_u64().unwrap() >= 250_000_000, "{v}");
    }
}

#[test]
fn shutdown_is_a_clean_end_with_a_report() {
    let _g = common::serial();
    let (vmm, _c) = running("shutdown");
    let (code, report) = vmm.shutdown();
    assert_eq!(code, 0, "a shutdown is a clean end");
    assert_eq!(report["vm"]["end"], json!("shutdown"));
    assert_eq!(report["vcpus"].as_array().unwrap().len(), 2);
}

#[test]
fn subscribers_get_every_vcpu_exit_and_threshold_events() {
    let _g = common::serial();
    let vmm = Vmm::start(
        "events",
        &[
            "--vcpus",
            "3",
            "--workload",
            "exits:n=30000",
            "--threshold",
            "guest_run_ns=1",
        ],
    );
    let mut c = vmm.connect();
    let r = c.ok(
        json!({"id": "s", "cmd": "subscribe", "events": ["vcpu-exit", "vm-exit", "threshold"]}),
    );
    assert_eq!(r["events"].as_array().unwrap().len(), 3);
    let mut exited = std::collections::BTreeSet::new();
    let mut thresholds = 0;
    loop {
        let e = c.line();
        match e["event"].as_str().unwrap() {
            "vcpu-exit" => {
                assert_eq!(e["end"], json!("exited"), "{e}");
                assert_eq!(e["exit_code"], json!(0), "{e}");
                exited.insert(e["vcpu"].as_u64().unwrap());
            }
            "threshold" => {
                assert_eq!(e["name"], json!("guest_run_ns"), "{e}");
                assert!(e["count"].as_u64().unwrap() > 0);
                thresholds += 1;
            }
            "vm-exit" => {
                assert_eq!(e["end"], json!("completed"), "{e}");
                break;
            }
            other => panic!("unexpected event {other}: {e}"),
        }
    }
    assert_eq!(exited.len(), 3, "a vcpu-exit for every vCPU");
    assert!(
        thresholds > 0,
        "guest runs above 1 ns raise threshold events"
    );
    let mut vmm = vmm;
    let (code, _) = vmm.wait();
    assert_eq!(code, 0);
}

#[test]
fn bad_clients_affect_only_themselves() {
    let _g = common::serial();
    let vmm = Vmm::start("bad", &["--vcpus", "2", "--workload", "busy:ms=60000"]);
    let mut good = vmm.connect();
    let used0 = good.stats().vcpus[0].used_ns;

    let mut c = vmm.connect();
    let mut long = br#"{"cmd":"stats","pad":""#.to_vec();
    long.resize(70 * 1024, b'a');
    long.extend_from_slice(b"\"}");
    assert_eq!(c.error_kind(&long), "too-long");
    assert_eq!(c.error_kind(b"{not json"), "bad-json");
    assert_eq!(c.error_kind(br#"{"cmd":"reboot"}"#), "unknown-command");
    assert_eq!(
        c.error_kind(br#"{"cmd":"stats","all":true}"#),
        "bad-request"
    );
    assert_eq!(c.error_kind(br#"{"cmd":"vcpu","vcpu":99}"#), "no-such-vcpu");
    // The same connection still works after its errors.
    assert_eq!(c.ok(json!({"id": 1, "cmd": "version"}))["api"], json!(1));

    // A client that connects and sends nothing, and one that sends half a line.
    let _silent = UnixStream::connect(&vmm.sock).unwrap();
    let mut half = UnixStream::connect(&vmm.sock).unwrap();
    half.write_all(br#"{"cmd":"sta"#).unwrap();
    // Clients that disconnect in the middle of a large response.
    for _ in 0..20 {
        let mut s = UnixStream::connect(&vmm.sock).unwrap();
        s.write_all(b"{\"cmd\":\"metrics\"}\n{\"cmd\":\"histogram\",\"name\":\"exit_handling\",\"format\":\"text\"}\n")
            .unwrap();
        let mut first = [0u8; 10];
        let _ = s.read(&mut first);
    }
    // A client that sends requests and never reads the answers.
    let stuck = UnixStream::connect(&vmm.sock).unwrap();
    stuck.set_nonblocking(true).unwrap();
    let req = b"{\"cmd\":\"stats\"}\n".repeat(1000);
    let t0 = Instant::now();
    let mut sent = 0usize;
    while t0.elapsed() < Duration::from_millis(500) {
        match (&stuck).write(&req) {
            Ok(n) => sent += n,
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    assert!(sent > 0);

    // 200 clients at once, each answered.
    let mut many: Vec<Conn> = (0..200).map(|_| vmm.connect()).collect();
    for (i, m) in many.iter_mut().enumerate() {
        m.send_raw(format!("{{\"id\":{i},\"cmd\":\"version\"}}\n").as_bytes());
    }
    for (i, m) in many.iter_mut().enumerate() {
        let r = m.line();
        assert_eq!(r["id"], json!(i), "{r}");
        assert_eq!(r["ok"], json!(true));
    }
    drop(many);

    // The good client and the vCPUs went on throughout.
    let s = good.stats();
    assert!(s.vcpus[0].used_ns > used0, "the vCPU kept running");
    assert_eq!(s.vm.state, ppa_vmm_api::VmState::Running);
    let (code, report) = vmm.shutdown();
    assert_eq!(code, 0);
    assert_eq!(report["vm"]["end"], json!("shutdown"));
}

#[test]
fn other_users_are_refused() {
    let _g = common::serial();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test runs a client as uid 65534 and needs root (CI runs as root)");
    }
    let vmm = Vmm::start("uid", &["--vcpus", "1", "--workload", "busy:ms=60000"]);
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let mode = std::fs::metadata(&vmm.sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket is private");
    std::fs::set_permissions(vmm.dir.as_path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = |sock: &Path| {
        Command::new(bin())
            .args(["ctl", "--api-sock"])
            .arg(sock)
            .arg("version")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    // The file mode stops another user first...
    let o = as_nobody(&vmm.sock);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("ermission"),
        "{o:?}"
    );
    // ...and SO_PEERCRED stops them if the file mode is opened up.
    std::fs::set_permissions(&vmm.sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = as_nobody(&vmm.sock);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("permission-denied"),
        "{o:?}"
    );
    // Root is served.
    let o = ctl(&vmm.sock, &["version"]);
    assert!(o.status.success(), "{o:?}");
    let (code, _) = vmm.shutdown();
    assert_eq!(code, 0);
}

#[test]
fn ctl_and_top_as_an_operator_uses_them() {
    let _g = common::serial();
    let vmm = Vmm::start("ctl", &["--vcpus", "3", "--workload", "mixed:ms=60000"]);
    let o = ctl(&vmm.sock, &["stats"]);
    assert!(o.status.success(), "{o:?}");
    let s: Stats = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s.vcpus.len(), 3);
    let o = ctl(&vmm.sock, &["vcpu", "vcpu=1"]);
    assert!(o.status.success(), "{o:?}");
    let o = ctl(&vmm.sock, &["vcpu", "vcpu=7"]);
    assert_eq!(o.status.code(), Some(1), "an error response: {o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("no-such-vcpu"));
    let o = ctl(&vmm.sock, &["frobnicate"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let o = ctl(&vmm.sock, &["--text", "stats"]);
    assert!(o.status.success(), "{o:?}");
    let o = ctl(
        &vmm.sock,
        &["--text", "histogram", "name=guest_run", "format=text"],
    );
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("# histogram guest_run"));

    // top --once: a row per vCPU and a total.
    let o = Command::new(bin())
        .args(["top", "--api-sock"])
        .arg(&vmm.sock)
        .args(["--once", "--interval", "200", "--sort", "used"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("USED%"), "{text}");
    for i in 0..3 {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().next() == Some(&i.to_string())),
            "a row for vCPU {i}: {text}"
        );
    }

    // promtool accepts the metrics of a live VM.
    let o = ctl(&vmm.sock, &["--text", "metrics"]);
    assert!(o.status.success(), "{o:?}");
    common::prom::promtool_accepts(std::str::from_utf8(&o.stdout).expect("the text is UTF-8"));
    let (code, _) = vmm.shutdown();
    assert_eq!(code, 0);
}

#[test]
fn a_second_cmd_cannot_be_smuggled_and_ids_come_back_exactly() {
    let _g = common::serial();
    let vmm = Vmm::start("dup", &["--vcpus", "1", "--workload", "busy:ms=60000"]);
    let mut c = vmm.connect();
    c.send_raw(b"{\"id\":1,\"cmd\":\"version\",\"cmd\":\"shutdown\"}\n");
    let r = c.line();
    assert_eq!(r["ok"], json!(false), "{r}");
    assert_eq!(r["error"]["kind"], json!("bad-request"), "{r}");
    assert_eq!(r["id"], json!(1), "{r}");
    // Not shut down: running, or (the request came as the socket appeared, and the api thread
    // answers at SCHED_FIFO) its vCPUs not yet released.
    let state = c.stats().vm.state;
    assert!(
        matches!(
            state,
            ppa_vmm_api::VmState::Running | ppa_vmm_api::VmState::Created
        ),
        "the VM was not shut down: {state:?}"
    );
    // Ids as the client wrote them, for every kind of answer (stats has its own encoder).
    let mut raw = std::io::BufReader::new(UnixStream::connect(&vmm.sock).unwrap());
    for id in [
        "12345678901234567890123",
        "1.0",
        "-0",
        "2.50e-3",
        "\"\\u00e9\"",
    ] {
        for rest in [
            r#""cmd":"stats""#,
            r#""cmd":"version""#,
            r#""cmd":"vcpu","vcpu":5"#,
        ] {
            let line = format!("{{\"id\":{id},{rest}}}\n");
            raw.get_mut().write_all(line.as_bytes()).unwrap();
            let mut answer = String::new();
            std::io::BufRead::read_line(&mut raw, &mut answer).unwrap();
            assert!(
                answer.starts_with(&format!("{{\"id\":{id},")),
                "{line} -> {answer}"
            );
        }
    }
    let (code, _) = vmm.shutdown();
    assert_eq!(code, 0);
}

/// Starts `ppa-vmm ctl subscribe ARGS` and `ppa-vmm top` on `sock`, and returns them once
/// both are under way (each has printed its first line).
fn watchers(sock: &Path, subscribe: &[&str]) -> Vec<std::process::Child> {
    let spawn = |args: &[&str]| {
        Command::new(bin())
            .args([args[0], "--api-sock"])
            .arg(sock)
            .args(&args[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut sub = vec!["ctl", "subscribe"];
    sub.extend_from_slice(subscribe);
    let mut children = vec![spawn(&sub), spawn(&["top", "--interval", "50"])];
    for c in &mut children {
        let mut first = [0u8; 1];
        c.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
    }
    children
}

/// Exit codes and stderr of the watchers.
fn watcher_ends(children: Vec<std::process::Child>) -> Vec<(Option<i32>, String)> {
    children
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().unwrap();
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .collect()
}

#[test]
fn subscribe_and_top_tell_a_killed_vmm_from_the_vms_end() {
    let _g = common::serial();
    // The VM ends: both exit 0.
    let vmm = Vmm::start(
        "watch-end",
        &["--vcpus", "1", "--workload", "idle:ms=60000"],
    );
    let children = watchers(&vmm.sock, &["events=threshold"]);
    let (code, _) = vmm.shutdown();
    assert_eq!(code, 0);
    for (code, err) in watcher_ends(children) {
        assert_eq!(code, Some(0), "{err}");
    }
    // The VMM is killed (SIGKILL, on drop): both say so and exit 3.
    let vmm = Vmm::start(
        "watch-kill",
        &["--vcpus", "1", "--workload", "idle:ms=60000"],
    );
    let children = watchers(&vmm.sock, &["events=threshold"]);
    drop(vmm);
    for (code, err) in watcher_ends(children) {
        assert_eq!(code, Some(3), "{err}");
        assert!(err.contains("killed or crashed"), "{err}");
    }
}

#[test]
fn top_shows_finished_vcpus_and_a_vm_total() {
    let _g = common::serial();
    let vmm = Vmm::start(
        "top-done",
        &[
            "--vcpus",
            "2",
            "--workload",
            "0=busy:ms=50",
            "--workload",
            "1=busy:ms=60000",
        ],
    );
    let mut c = vmm.connect();
    for _ in 0..2000 {
        if c.stats().vcpus[0].state == ppa_vmm_api::VcpuMicroState::Finished {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let o = Command::new(bin())
        .args(["top", "--api-sock"])
        .arg(&vmm.sock)
        .args(["--once", "--interval", "200"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    let row = |first: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(first))
            .unwrap_or_else(|| panic!("no row {first}: {text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    let done = row("0");
    assert_eq!(done.last(), Some(&"(finished)"), "{text}");
    // Its whole life: it spun all along, so it used most of its wall time.
    let used: f64 = done[2].parse().unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(used > 0.0, "{text}");
    // The VM line has figures, not `-`: vCPU 1 alone.
    let vm = row("VM");
    let vm_used: f64 = vm[2].parse().unwrap_or_else(|e| panic!("{e}: {text}"));
    let one_used: f64 = row("1")[2].parse().unwrap();
    assert!((vm_used - one_used).abs() < 0.11, "{text}");
    let (code, _) = vmm.shutdown();
    assert_eq!(code, 0);
}

#[test]
fn ctl_text_of_groups_and_of_the_guest_after_a_reset() {
    let _g = common::serial();
    let vmm = Vmm::start(
        "text",
        &[
            "--vcpus",
            "2",
            "--workload",
            "busy:ms=60000",
            "--vcpu-group",
            "g:0-1:50%",
        ],
    );
    // A second of 100 ms periods: overshoots to histogram.
    std::thread::sleep(Duration::from_millis(1000));
    let o = ctl(&vmm.sock, &["--text", "groups"]);
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.lines().count() <= 4, "one line per limit: {text}");
    assert!(text.lines().any(|l| l.starts_with("g ")), "{text}");
    assert!(!text.contains("slots"), "{text}");
    // After a reset the host figures count from it, the guest's from its boot: marked.
    let o = ctl(&vmm.sock, &["--text", "guest"]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("count from a `reset`"));
    let o = ctl(&vmm.sock, &["reset"]);
    assert!(o.status.success(), "{o:?}");
    let o = ctl(&vmm.sock, &["--text", "guest"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("host figures of vCPU 0, 1 count from a `reset`"),
        "{text}"
    );
    let (code, report) = vmm.shutdown();
    assert_eq!(code, 0);
    assert_eq!(report["guest"]["host_reset"], json!([true, true]));
}
