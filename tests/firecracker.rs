//! `ppa-vmm firecracker` end to end: a Firecracker client nobody here wrote (the pinned
//! firecracker-python package, in the virtual environment scripts/setup.sh makes under
//! target/) boots the tiny guest through Firecracker's API with a network interface on a tap
//! in a namespace of the test's own, pauses and resumes it, reads its config, and ends it;
//! every answer is checked against what Firecracker's API documents, and the same VM's
//! accounting against our own control socket. Then a VM from a Firecracker-layout config
//! file with `--no-api`, started under the name `firecracker`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::netns::NetNs;
use common::vmm::{bin, temp_dir};
use serde_json::Value;

/// A directory whose path has no capitals, removed on drop.
struct LowerDir(PathBuf);

impl LowerDir {
    fn new() -> LowerDir {
        let p = std::env::temp_dir().join(format!("ppa-fc-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        LowerDir(p)
    }
}

impl Drop for LowerDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The client's Python, made by scripts/setup.sh.
fn client_python() -> PathBuf {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/firecracker-client/venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: scripts/setup.sh installs the pinned Firecracker client there",
        p.display()
    );
    p
}

/// Waits for `path` to exist (the API socket of the VMM `child` starting).
fn wait_for(path: &Path, child: &mut std::process::Child) {
    for _ in 0..2000 {
        if path.exists() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            use std::io::Read;
            let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
            panic!("the VMM ended ({status}) before its API socket appeared: {err}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("{} did not appear", path.display());
}

/// The steps the client printed, by name.
fn steps(stdout: &str) -> std::collections::BTreeMap<String, (i64, Value)> {
    stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            let step = v["step"].as_str().unwrap().to_string();
            (step, (v["status"].as_i64().unwrap(), v["body"].clone()))
        })
        .collect()
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// The client's error text of a refused step (its APIError carries the fault_message).
fn refusal(s: &(i64, Value)) -> &str {
    assert_eq!(s.0, 400, "{s:?}");
    s.1["client_error"]
        .as_str()
        .or(s.1["fault_message"].as_str())
        .unwrap_or_else(|| panic!("no fault_message: {s:?}"))
}

/// Checks the answers of the steps before the start.
fn check_pre_boot(s: &std::collections::BTreeMap<String, (i64, Value)>) {
    let info = &s["describe"];
    assert_eq!(info.0, 200);
    assert_eq!(info.1["state"], "Not started");
    assert_eq!(info.1["id"], "fc-e2e");
    assert_eq!(info.1["app_name"], "Firecracker");
    assert!(info.1["vmm_version"].as_str().unwrap().contains("ppa-vmm"));
    assert_eq!(s["version"].0, 200);
    assert!(s["version"].1["firecracker_version"].is_string());
    // Firecracker's defaults before any PUT: 1 vCPU, 128 MiB, no SMT.
    let d = &s["machine-config-default"].1;
    assert_eq!((n(&d["vcpu_count"]), n(&d["mem_size_mib"])), (1, 128));
    assert_eq!(d["smt"], false);
    for ok in [
        "logger",
        "metrics",
        "machine-config",
        "boot-source",
        "network-interface",
    ] {
        assert_eq!(s[ok].0, 204, "{ok}: {:?}", s[ok]);
        assert_eq!(s[ok].1, Value::Null, "204 has no body");
    }
    let bad = &s["bad-body"];
    assert_eq!(bad.0, 400);
    assert!(bad.1["fault_message"]
        .as_str()
        .unwrap()
        .starts_with("An error occurred when deserializing the json body of a request"));
    assert!(refusal(&s["unknown-field"]).contains("unknown field `cpus`"));
    assert!(refusal(&s["smt"]).contains("smt cannot be enabled"));
    // Nothing the refusals carried changed the config.
    let m = &s["machine-config-after-refusals"].1;
    assert_eq!((n(&m["vcpu_count"]), n(&m["mem_size_mib"])), (2, 64));
    assert_eq!(m["smt"], false);
    assert!(
        refusal(&s["drive"]).contains("drive rootfs: cannot open /nonexistent.ext4"),
        "{:?}",
        s["drive"]
    );
    assert_eq!(s["drive-data"].0, 204, "{:?}", s["drive-data"]);
    // A start that fails says why and leaves the instance to be fixed and started again.
    assert_eq!(s["boot-source-bad"].0, 204);
    assert!(refusal(&s["start-bad"]).starts_with("API fault: Start microvm error: "));
    assert_eq!(s["describe-after-bad-start"].1["state"], "Not started");
    assert!(refusal(&s["flush-before-start"]).contains("not supported before starting"));
}

/// Checks what our own control socket said of the paused VM: the same VM, exact accounting.
fn check_control_socket(s: &std::collections::BTreeMap<String, (i64, Value)>) {
    let (code, stats) = &s["stats-paused"];
    assert_eq!(*code, 0, "{stats}");
    assert_eq!(stats["vm"]["name"], "fc-e2e");
    assert_eq!(stats["vm"]["state"], "paused");
    let vcpus = stats["vcpus"].as_array().unwrap();
    assert_eq!(vcpus.len(), 2);
    for v in vcpus {
        // Spec section 4's identity, exact: wall = used + steal + halted + idle + limited +
        // paused + blocked - error, the error reported.
        let parts = [
            "used_ns",
            "steal_ns",
            "halted_ns",
            "idle_ns",
            "limited_ns",
            "paused_ns",
            "blocked_ns",
        ]
        .iter()
        .map(|k| n(&v[*k]))
        .sum::<u64>() as i64;
        assert_eq!(
            n(&v["wall_ns"]) as i64,
            parts + v["identity_error_ns"].as_i64().unwrap(),
            "{v}"
        );
        assert_eq!(n(&v["used_ns"]), n(&v["guest_ns"]) + n(&v["vmm_ns"]), "{v}");
        assert_eq!(v["state"], "paused", "{v}");
    }
    assert!(n(&vcpus[1]["guest_ns"]) > 0, "the busy vCPU ran");
    let (code, threads) = &s["threads"];
    assert_eq!(*code, 0);
    let names: Vec<&str> = threads["vcpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["fc_vcpu 0", "fc_vcpu 1"],
        "the names Kata looks for"
    );
    // The kernel's names of the same threads (what `ps -L` and Kata read).
    assert_eq!(s["comms"].1, serde_json::json!(names));
}

/// Checks the answers of the steps from the start on, and what our tools said meanwhile.
fn check_post_boot(s: &std::collections::BTreeMap<String, (i64, Value)>) {
    assert_eq!(s["start"].0, 204, "{:?}", s["start"]);
    assert_eq!(s["describe-running"].1["state"], "Running");
    for late in [
        "machine-config-post-boot",
        "boot-source-post-boot",
        "network-interface-post-boot",
        "start-again",
    ] {
        assert_eq!(
            refusal(&s[late]),
            "API fault: The requested operation is not supported after starting the microVM.",
            "{late}"
        );
    }
    assert_eq!(s["pause"].0, 204);
    assert_eq!(s["describe-paused"].1["state"], "Paused");
    check_control_socket(s);
    assert_eq!(s["resume"].0, 204);
    assert_eq!(s["describe-resumed"].1["state"], "Running");
    let cfg = &s["vm-config"].1;
    assert_eq!(n(&cfg["machine-config"]["vcpu_count"]), 2);
    assert_eq!(cfg["network-interfaces"][0]["host_dev_name"], "tap0");
    assert_eq!(
        cfg["network-interfaces"][0]["guest_mac"],
        "06:00:ac:10:00:02"
    );
    assert_eq!(cfg["drives"][0]["drive_id"], "data");
    assert_eq!(cfg["drives"][0]["is_read_only"], true);
    let (code, dev) = &s["device"];
    assert_eq!(*code, 0, "{dev}");
    assert_eq!(dev["mac"], "06:00:ac:10:00:02");
    // The interface's limiters are the device's rate: its transmit limiter from the start,
    // a PATCH with the same one changed nothing, and one that adds a receive limiter gave the
    // running device that bucket too (Firecracker's update: the limiter left out stays).
    assert_eq!(s["net-patch-same"].0, 204, "{:?}", s["net-patch-same"]);
    assert_eq!(s["net-patch-other"].0, 204, "{:?}", s["net-patch-other"]);
    assert_eq!(
        dev["rate"], "rx-packets:10/100ms+tx-bytes:1250000/100ms",
        "{dev}"
    );
    assert_eq!(
        cfg["network-interfaces"][0]["rx_rate_limiter"]["ops"]["size"], 10,
        "{cfg}"
    );
    // The drive is a virtio-blk device of our own, read-only as the drive said, 1 MiB.
    let (code, disk) = &s["device-disk"];
    assert_eq!(*code, 0, "{disk}");
    assert_eq!(disk["kind"], "blk", "{disk}");
    assert_eq!(disk["blk"]["readonly"], true, "{disk}");
    assert_eq!(n(&disk["blk"]["capacity_bytes"]), 1 << 20, "{disk}");
    assert!(
        refusal(&s["drive-patch-post-boot"]).contains("cannot swap a drive's file"),
        "{:?}",
        s["drive-patch-post-boot"]
    );
    // Its rate limiter can change while the VM runs.
    assert_eq!(s["drive-patch-rate"].0, 204, "{:?}", s["drive-patch-rate"]);
    assert_eq!(disk["rate"], "ops:100/1s", "{disk}");
    assert_eq!(s["flush"].0, 204);
    // The run directory's view of the same VM.
    let (code, list) = &s["host-list"];
    assert_eq!(*code, 0, "{list}");
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(names, ["fc-e2e"], "{list}");
}

#[test]
fn a_firecracker_client_boots_pauses_resumes_and_ends_the_tiny_guest() {
    let _g = common::serial();
    common::require_kvm();
    let python = client_python();
    let ns = NetNs::new(false);
    let dir = temp_dir("fc-api");
    let d = dir.as_path();
    // The client puts the socket path in a URL's host, which it lowercases: a path with
    // capitals (the temporary directory's) is not found. Its own directory, in lowercase.
    let sock_dir = LowerDir::new();
    let api_sock = sock_dir.0.join("fc.sock");
    let run_dir = d.join("run");
    let tiny = d.join("tiny.elf");
    std::fs::write(&tiny, ppa_vmm::payload::tiny::TINY_GUEST).unwrap();
    let mut vmm = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.name,
            bin(),
            "firecracker",
            "--id",
            "fc-e2e",
        ])
        .arg("--api-sock")
        .arg(&api_sock)
        .arg("--run-dir")
        .arg(&run_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ppa-vmm starts");
    wait_for(&api_sock, &mut vmm);
    let (log, metrics) = (d.join("fc.log"), d.join("fc.metrics"));
    let client = Command::new(&python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/firecracker_client.py"
        ))
        .args([&api_sock, &run_dir.join("fc-e2e.sock")])
        .arg(bin())
        .args([&tiny, &log, &metrics])
        .output()
        .expect("the client runs");
    let out = String::from_utf8_lossy(&client.stdout);
    if !client.status.success() {
        let _ = vmm.kill();
        let vmm_out = vmm.wait_with_output().unwrap();
        panic!(
            "client: {out}\n{}\nthe VMM: {}",
            String::from_utf8_lossy(&client.stderr),
            String::from_utf8_lossy(&vmm_out.stderr)
        );
    }
    let s = steps(&out);
    check_pre_boot(&s);
    check_post_boot(&s);
    assert_eq!(s["ctrl-alt-del"].0, 204);
    // SendCtrlAltDel ends the VM; the process exits as Firecracker's does.
    let done = vmm.wait_with_output().unwrap();
    assert_eq!(
        done.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(!api_sock.exists(), "the API socket is removed at the end");
    check_metrics(&metrics);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("[fc-e2e:"),
        "Firecracker's log line shape: {log}"
    );
}

/// The metrics lines: the FlushMetrics one and the last one, Firecracker's names beside ours.
fn check_metrics(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 2, "{text}");
    let flush = &lines[0];
    assert!(n(&flush["utc_timestamp_ms"]) > 0);
    assert!(
        n(&flush["put_api_requests"]["machine_cfg_count"]) >= 4,
        "{flush}"
    );
    assert!(
        n(&flush["put_api_requests"]["machine_cfg_fails"]) >= 3,
        "{flush}"
    );
    let vcpus = flush["vcpu"]["ppa_vcpus"].as_array().unwrap();
    assert_eq!(vcpus.len(), 2);
    assert!(n(&vcpus[1]["guest_ns"]) > 0, "{flush}");
    assert!(flush["vcpu"]["exit_mmio_write"].is_u64());
    let eth0 = &flush["net_eth0"];
    assert!(
        eth0["rx_packets_count"].is_u64() && eth0["tx_packets_count"].is_u64(),
        "{eth0}"
    );
    assert!(
        !eth0["ppa_threads"].as_array().unwrap().is_empty(),
        "{eth0}"
    );
    assert!(flush["ppa"]["uptime_ns"].is_u64());
    // Counts since the previous line: the last line counts no second configuration.
    let last = lines.last().unwrap();
    assert_eq!(
        n(&last["put_api_requests"]["machine_cfg_count"]),
        0,
        "{last}"
    );
    assert!(
        n(&last["vcpu"]["ppa_vcpus"][1]["guest_ns"]) >= n(&vcpus[1]["guest_ns"]),
        "ours are totals"
    );
}

#[test]
fn a_config_file_boots_the_tiny_guest_without_the_api() {
    let _g = common::serial();
    common::require_kvm();
    let dir = temp_dir("fc-file");
    let d = dir.as_path();
    let tiny = d.join("tiny.elf");
    std::fs::write(&tiny, ppa_vmm::payload::tiny::TINY_GUEST).unwrap();
    let metrics = d.join("m.json");
    let cfg = d.join("vm.json");
    let report = d.join("report.json");
    std::fs::write(
        &cfg,
        serde_json::json!({
            "boot-source": {"kernel_image_path": tiny,
                            "boot_args": "ppa.workload=busy:ms=200"},
            "machine-config": {"vcpu_count": 2, "mem_size_mib": 64},
            "network-interfaces": [],
            "drives": [],
            "metrics": {"metrics_path": metrics, "emit_id": true}
        })
        .to_string(),
    )
    .unwrap();
    let ppa = d.join("ppa.json");
    std::fs::write(
        &ppa,
        serde_json::json!({"report": "json", "report_file": report}).to_string(),
    )
    .unwrap();
    // Under the name `firecracker`, as Kata and firecracker-containerd run it.
    let link = d.join("firecracker");
    std::os::unix::fs::symlink(bin(), &link).unwrap();
    let out = Command::new(&link)
        .args(["--no-api", "--id", "fc-file"])
        .arg("--config-file")
        .arg(&cfg)
        .arg("--ppa-config")
        .arg(&ppa)
        .arg("--run-dir")
        .arg(d.join("run"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["vm"]["name"], "fc-file");
    assert_eq!(r["vm"]["end"], "completed");
    assert_eq!(r["vcpus"].as_array().unwrap().len(), 2);
    let m = std::fs::read_to_string(&metrics).unwrap();
    let last: Value = serde_json::from_str(m.lines().last().unwrap()).unwrap();
    assert_eq!(last["id"], "fc-file");
    assert!(n(&last["vcpu"]["ppa_vcpus"][0]["guest_ns"]) > 0, "{last}");
    // A file with a section PPA-VMM does not have is refused with a sentence, nothing run.
    std::fs::write(
        &cfg,
        serde_json::json!({
            "boot-source": {"kernel_image_path": tiny},
            "vsock": {"guest_cid": 3, "uds_path": d.join("v.sock")}
        })
        .to_string(),
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["firecracker", "--no-api", "--config-file"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`vsock` section is not supported: vsock is not there yet"),
        "{err}"
    );
}
