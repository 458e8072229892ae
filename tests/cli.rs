//! End-to-end tests of the `ppa-vmm` binary as a user runs it: the JSON report on stdout, the
//! demo, and a clear error with exit code 2 for every kind of bad input.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::vmm::temp_dir;
use common::{require_kvm, serial};
use vmm_sys_util::tempdir::TempDir;

fn ppa_vmm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ppa-vmm"))
        .args(args)
        .output()
        .expect("the ppa-vmm binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Writes `bytes` to the file `name` in `dir`.
fn temp_file(dir: &TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.as_path().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn run_prints_a_json_report_on_stdout() {
    require_kvm();
    let _g = serial();
    let o = ppa_vmm(&[
        "run",
        "--vcpus",
        "2",
        "--workload",
        "busy:ms=20",
        "--workload",
        "1=exits:n=50,kind=pio",
        "--report",
        "json",
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let r: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("stdout is one JSON object");
    assert_eq!(r["vm"]["vcpus"], 2);
    assert_eq!(r["vm"]["end"], "completed");
    let vcpus = r["vcpus"].as_array().unwrap();
    assert_eq!(vcpus.len(), 2);
    assert_eq!(vcpus[0]["id"], 0);
    assert_eq!(vcpus[0]["exit_code"], 0);
    assert!(vcpus[0]["host_tid"].as_i64().unwrap() > 0);
    assert!(vcpus[0]["wall_ns"].as_u64().unwrap() >= 20_000_000);
    assert_eq!(vcpus[1]["exits"]["io_out"], 50);
    // The guest's own measurements are in the report (how close its spin comes to the
    // workload's length is the accuracy target's).
    let spin = vcpus[0]["guest_reported"]["spin_ns"].as_u64().unwrap();
    assert!(spin > 0, "spin_ns {spin}");
    assert_eq!(
        r["groups"].as_array().map(Vec::len),
        Some(0),
        "no groups without limits"
    );
    // The tiny guest's console (its greeting) is not printed by default (issue 28: every run
    // printed `[vcpu0] tiny: N vcpus`)...
    assert!(!stderr(&o).contains("tiny:"), "{}", stderr(&o));
    // ... and goes to stderr, never into the report, at PPA_VMM_LOG=info.
    let o = Command::new(env!("CARGO_BIN_EXE_ppa-vmm"))
        .args([
            "run",
            "--vcpus",
            "2",
            "--workload",
            "busy:ms=1",
            "--report",
            "json",
        ])
        .env("PPA_VMM_LOG", "info")
        .output()
        .unwrap();
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    assert!(
        stderr(&o).contains("[vcpu0] tiny: 2 vcpus"),
        "{}",
        stderr(&o)
    );
    serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("stdout is the report alone");
}

#[test]
fn config_file_and_report_file() {
    require_kvm();
    let _g = serial();
    let dir = temp_dir("cli");
    let cfg = temp_file(
        &dir,
        "vm.json",
        br#"{"vcpus": 3, "workload": ["idle:ms=10", "2=exits:n=7"], "report": "json"}"#,
    );
    let out = cfg.with_file_name("report.json");
    let o = ppa_vmm(&[
        "run",
        "--config",
        cfg.to_str().unwrap(),
        "--report-file",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    assert!(o.stdout.is_empty());
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(r["vcpus"].as_array().unwrap().len(), 3);
    // Who and when: the default name, the pid, and the start and end as RFC 3339 UTC and
    // CLOCK_REALTIME ns.
    let pid = r["vm"]["pid"].as_u64().expect("a pid");
    assert!(pid > 0);
    assert_eq!(r["vm"]["name"], format!("ppa-vmm-{pid}"));
    let start = r["vm"]["started_realtime_ns"].as_u64().unwrap();
    let end = r["vm"]["ended_realtime_ns"].as_u64().unwrap();
    assert!(start <= end, "{start} {end}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(
        end <= now && now - start < 600_000_000_000,
        "{start} {end} {now}"
    );
    let at = r["vm"]["started_at"].as_str().unwrap();
    assert_eq!(at.len(), "2026-11-23T17:47:00.123456789Z".len(), "{at}");
    assert!(at.ends_with('Z') && at.as_bytes()[10] == b'T', "{at}");
    assert_eq!(r["vm"]["signal"], serde_json::Value::Null);
    assert_eq!(r["vcpus"][2]["doorbells"]["workload_mmio"], 7);
    assert_eq!(r["vcpus"][0]["workload"], "idle:ms=10");
}

#[test]
fn histograms_are_written_in_the_kstats_text_form() {
    require_kvm();
    let _g = serial();
    let dir = temp_dir("cli");
    let path = temp_file(&dir, "hist.txt", b"");
    let o = ppa_vmm(&[
        "run",
        "--vcpus",
        "2",
        "--workload",
        "exits:n=500",
        "--report",
        "none",
        "--histograms-file",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("# histogram exit_handling"), "{text}");
    // Every data line is self-contained: slot S vcpu V count C avg A p P (or vcpus N).
    let mut per_vcpu_counts = [0u64; 2];
    let mut in_exit_handling = false;
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("# histogram ") {
            in_exit_handling = h.starts_with("exit_handling ");
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 10, "{line}");
        assert_eq!(
            (f[0], f[4], f[6], f[8]),
            ("slot", "count", "avg", "p"),
            "{line}"
        );
        let p: f64 = f[9].parse().unwrap();
        assert!((0.0..=1.0).contains(&p), "{line}");
        if in_exit_handling && f[2] == "vcpu" {
            per_vcpu_counts[f[3].parse::<usize>().unwrap()] += f[5].parse::<u64>().unwrap();
        }
    }
    // Each vCPU handled 500 workload exits plus protocol doorbells; the last exit (the exit
    // doorbell) ends the vCPU before its handling is complete.
    for c in per_vcpu_counts {
        assert!(c >= 500, "exit_handling counts {per_vcpu_counts:?}");
    }
}

#[test]
fn tiny_image_boots_the_same_image_from_a_file() {
    require_kvm();
    let _g = serial();
    let dir = temp_dir("cli");
    let path = temp_file(&dir, "tiny.elf", ppa_vmm::payload::tiny::TINY_GUEST);
    let o = ppa_vmm(&[
        "run",
        "--tiny-image",
        path.to_str().unwrap(),
        "--workload",
        "exits:n=3",
        "--report",
        "json",
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["vcpus"][0]["doorbells"]["workload_mmio"], 3);
}

#[test]
fn demo_runs_four_vcpus_and_prints_a_report() {
    require_kvm();
    let _g = serial();
    let o = ppa_vmm(&["demo"]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("4 vCPUs"), "{text}");
    for w in ["busy:", "periodic:", "exits:", "idle:"] {
        assert!(text.contains(w), "demo runs {w}: {text}");
    }
}

#[test]
fn fault_gives_a_nonzero_exit_code_and_the_reason() {
    require_kvm();
    let _g = serial();
    let o = ppa_vmm(&[
        "run",
        "--vcpus",
        "2",
        "--workload",
        "1=fault:kind=hlt",
        "--report",
        "text",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("shut down"), "{text}");
    assert!(text.contains("rip="), "{text}");
}

/// Bad input: exit code 2, one clear line on stderr naming the problem, no panic.
fn refused(args: &[&str], needle: &str) {
    let o = ppa_vmm(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "args {args:?}: stderr {err}");
    assert!(
        err.contains(needle),
        "args {args:?}: stderr {err:?} lacks {needle:?}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_input_is_refused_clearly() {
    let dir = temp_dir("cli");
    let not_elf = temp_file(
        &dir,
        "not.elf",
        b"this is not an ELF file at all, just text",
    );
    let mut bz = vec![0u8; 0x400];
    bz[0x202..0x206].copy_from_slice(b"HdrS");
    let bzimage = temp_file(&dir, "bzImage", &bz);
    let bad_cfg = temp_file(&dir, "bad.json", br#"{"vcpus": 2, "cpus": 4}"#);
    let list_cfg = temp_file(&dir, "list.json", b"[]");
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--tiny-image", "/nonexistent/image.elf"],
            "/nonexistent/image.elf",
        ),
        (
            &["run", "--tiny-image", not_elf.to_str().unwrap()],
            "not an ELF",
        ),
        (
            &["run", "--tiny-image", bzimage.to_str().unwrap()],
            "Linux kernel",
        ),
        (
            &["run", "--guest", "tiny", "--tiny-image", "/x.elf"],
            "not several",
        ),
        (
            &["run", "--kernel", "/x", "--workload", "busy"],
            "runs on the tiny guest",
        ),
        (&["run", "--initrd", "/x.img"], "go with --kernel"),
        (&["bench", "socket", "--exits", "5"], "--window-ms"),
        (&["bench", "socket", "--window-ms", "5"], "100..=600000"),
        (&["run", "--vcpus", "0"], "between 1 and 256 vCPUs"),
        (&["run", "--vcpus", "257"], "between 1 and 256 vCPUs"),
        (
            &["run", "--memory-mib", "1"],
            "guest memory must be between",
        ),
        (
            &["run", "--memory-mib", "2000000"],
            "guest memory must be between",
        ),
        (&["run", "--vcpus", "256", "--memory-mib", "4"], "too small"),
        (&["run", "--memory-mib", "300000"], "maps at most 224 GiB"),
        (
            &["run", "--workload", "spin:ms=3"],
            "unknown workload `spin`",
        ),
        (
            &["run", "--workload", "busy:sec=3"],
            "has no parameter `sec`",
        ),
        (&["run", "--vcpus", "2", "--workload", "5=busy"], "vCPU 5"),
        (&["run", "--guest", "linux"], "unknown guest `linux`"),
        (
            &["run", "--config", bad_cfg.to_str().unwrap()],
            "unknown field `cpus`",
        ),
        (
            &["run", "--config", "/nonexistent/vm.json"],
            "/nonexistent/vm.json",
        ),
        (&["run", "--max-runtime=-3"], "maximum run time"),
        (&["run", "--max-runtime", "1e9"], "below 1000000000 seconds"),
        (
            &["run", "--client-timeout", "1e10"],
            "below 1000000000 seconds",
        ),
        (
            &["run", "--api-sock", "/nonexistent/dir/x.sock"],
            "the directory /nonexistent/dir does not exist",
        ),
        (
            &["run", "--config", list_cfg.to_str().unwrap()],
            "expected a JSON object of run options",
        ),
        (&["run", "--max-runtime", "0"], "maximum run time"),
        (
            &["run", "--kvm-device", "/nonexistent/kvm"],
            "/nonexistent/kvm does not exist",
        ),
    ];
    for (args, needle) in cases {
        refused(args, needle);
    }
    // A KVM device path that does not exist is that, not a host without KVM.
    let o = ppa_vmm(&["run", "--kvm-device", "/nonexistent/kvm"]);
    assert!(
        !stderr(&o).contains("this host has no KVM"),
        "{}",
        stderr(&o)
    );
    // Limits: numbers that overflow say so; a quota below what can be enforced is refused.
    refused(
        &["run", "--cpu-limit", "99999999999999999999s/1s"],
        "is too large",
    );
    refused(&["run", "--cpu-limit", "1e30%"], "is too large");
    refused(&["run", "--cpu-limit", "1ns/1ms"], "below the smallest");
    refused(
        &["run", "--vcpus", "2", "--vcpu-group", "g:0-1:50us/1ms"],
        "below the smallest",
    );
    // Issue 39: below the least a busy vCPU can be held to, the sentence names that least
    // (vCPUs that share a quota take turns, so 1 ms per 10 ms over 5 vCPUs is not refused).
    refused(
        &["run", "--cpu-limit", "100us/10ms"],
        "the smallest the VMM holds, 250 us per period",
    );
    // clap's own refusals (unknown flag, bad number) also exit 2.
    refused(&["run", "--cpus", "2"], "--cpus");
    refused(&["run", "--vcpus", "two"], "two");
}

/// Issue 28: refusals quoted their input whole (a 50 MB `name` in a config went to stderr whole,
/// a 200 k-character workload twice); they quote a few hundred bytes and `…`, and a config
/// file over 1 MiB is refused as such.
#[test]
fn refusals_quote_long_input_cut() {
    let dir = temp_dir("cli-long");
    let long = "x".repeat(200_000);
    let name_cfg = temp_file(
        &dir,
        "name.json",
        format!(r#"{{"name": "{long}"}}"#).as_bytes(),
    );
    let huge = temp_file(
        &dir,
        "huge.json",
        format!(r#"{{"name": "{}"}}"#, "y".repeat(2 << 20)).as_bytes(),
    );
    let type_cfg = temp_file(
        &dir,
        "type.json",
        format!(r#"{{"vcpus": "{long}"}}"#).as_bytes(),
    );
    // One argument of a command line is at most 128 KiB.
    let arg = &long[..100_000];
    let spec = format!("busy:{arg}=1");
    let limit = format!("{arg}%");
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--config", name_cfg.to_str().unwrap()],
            "the VM name \"xxx",
        ),
        (
            &["run", "--config", huge.to_str().unwrap()],
            "is over 1048576 bytes",
        ),
        (
            &["run", "--config", type_cfg.to_str().unwrap()],
            "invalid type",
        ),
        (&["run", "--workload", &spec], "bad workload"),
        (&["run", "--cpu-limit", &limit], "is not a CPU limit"),
        // The run directory's rule (64 characters) refuses it before the config's (128).
        (
            &["run", "--name", arg],
            "cannot name files in the run directory",
        ),
    ];
    for (args, needle) in cases {
        let o = ppa_vmm(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err:.500}");
        assert!(err.contains(needle), "{err:.500} lacks {needle}");
        assert!(err.len() < 2000, "{} bytes: {err:.500}", err.len());
        // The file too large to read quotes nothing of it.
        assert!(err.contains('…') || needle.contains("over"), "{err:.500}");
    }
}

/// Issue 28: the text report's legend said `GUEST/VMM split: estimated (from none)`.
#[test]
fn the_text_report_says_how_the_split_was_made() {
    require_kvm();
    let _g = serial();
    let o = ppa_vmm(&["run", "--workload", "busy:ms=5", "--report", "text"]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.contains("(from none)"), "{text}");
    assert!(
        text.contains("GUEST/VMM split: estimated from wall time at level basic"),
        "{text}"
    );
    let o = ppa_vmm(&[
        "run",
        "--workload",
        "busy:ms=5",
        "--report",
        "text",
        "--accounting",
        "full",
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("GUEST/VMM split: measured exactly"), "{text}");
}

/// On this machine's KVM (the PVM backend) a Linux kernel cannot boot: `--kernel` is refused
/// before any vCPU runs, with a sentence saying why and where to go instead. On VMX/SVM hosts
/// the Linux boot itself is tested (tests/nested.rs runs it inside an emulated SVM host).
#[test]
fn a_linux_kernel_on_a_pvm_host_is_refused_with_the_reason() {
    let modules = std::fs::read_to_string("/proc/modules").unwrap_or_default();
    let loaded = |m: &str| modules.lines().any(|l| l.split(' ').next() == Some(m));
    if !loaded("kvm_pvm") || loaded("kvm_intel") || loaded("kvm_amd") {
        eprintln!("not a PVM host: the refusal does not apply here");
        return;
    }
    let dir = temp_dir("cli-pvm");
    let mut bz = vec![0u8; 0x400];
    bz[0x202..0x206].copy_from_slice(b"HdrS");
    let bzimage = temp_file(&dir, "bzImage", &bz);
    refused(
        &["run", "--kernel", bzimage.to_str().unwrap()],
        "cannot boot a Linux kernel",
    );
    refused(
        &["run", "--kernel", bzimage.to_str().unwrap()],
        "docs/linux.md",
    );
}

/// Issue 28: after a `reset` the text report's table mixed since-reset WALL with /proc ms and
/// an uptime that were not reset, without a marker; the reset vCPU's WALL is marked `*` and
/// the legend says what counts from where.
#[test]
fn a_reset_vcpu_is_marked_in_the_text_report() {
    let _g = serial();
    let vmm = common::vmm::Vmm::with_report(
        "cli-reset",
        "text",
        &["--vcpus", "2", "--workload", "busy:ms=60000"],
    );
    let mut c = vmm.connect();
    std::thread::sleep(std::time::Duration::from_millis(200));
    c.ok(serde_json::json!({"cmd": "reset", "vcpu": 1}));
    let out = vmm.shutdown_output();
    let text = String::from_utf8_lossy(&out.stdout);
    let row = |id: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .unwrap_or_else(|| panic!("no row {id}:\n{text}"))
            .to_string()
    };
    let wall = |id: &str| row(id).split_whitespace().nth(3).unwrap().to_string();
    assert!(wall("1").ends_with('*'), "{text}");
    assert!(!wall("0").ends_with('*'), "{text}");
    assert!(text.contains("* reset during the run"), "{text}");
}
