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
    done.send(()).unwrap();
    holder.join().unwrap();
}

#[test]
fn a_world_writable_run_directory_is_refused_with_a_sentence() {
    let d = temp_dir("host-ww");
    let dir = d.as_path().join("run");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = Command::new(bin())
        .args([
            "run",
            "--guest",
            "tiny",
            "--report",
            "none",
            "--name",
            "x",
            "--run-dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("world-writable"),
        "{o:?}"
    );
    let (code, _, err) = host(&["list", "--run-dir", dir.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("world-writable"), "{err}");
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
