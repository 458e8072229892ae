//! End-to-end tests of CPU limits on KVM: ground truth from the clock and the guest.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use ppa_vmm::config::RunOptions;
use ppa_vmm::vm::{RunOutcome, Vm};
use serde_json::{json, Value};

fn run(vcpus: usize, workload: &str, cpu_limit: Option<&str>, groups: &[&str]) -> RunOutcome {
    common::require_kvm();
    let opts = RunOptions {
        vcpus: Some(vcpus),
        workload: vec![workload.to_string()],
        cpu_limit: cpu_limit.map(str::to_string),
        vcpu_group: groups.iter().map(|s| s.to_string()).collect(),
        max_runtime: Some(60.0),
        ..Default::default()
    };
    let (config, _) = opts.into_config().expect("valid config");
    Vm::try_from(config)
        .expect("VM builds")
        .run()
        .expect("VM runs")
}

#[test]
fn one_busy_vcpu_is_held_to_25_percent() {
    let _g = common::serial();
    let out = run(1, "busy:ms=2000", Some("25%"), &[]);
    let v = &out.report.vcpus[0];
    let t = &v.times;
    let share = t.used_ns as f64 / t.wall_ns as f64;
    assert!(
        (share - 0.25).abs() <= 0.01,
        "used {:.2} % of wall, not 25 % within 1 point",
        share * 100.0
    );
    let rest = t.wall_ns - t.used_ns;
    let off = t.limited_ns.abs_diff(rest) as f64 / rest as f64;
    assert!(
        off <= 0.02,
        "limited_ns {} is {:.2} % away from the rest of wall {}",
        t.limited_ns,
        off * 100.0,
        rest
    );
    common::assert_identity(&out.report, v);
    // The guest saw the same: it ran about a quarter of its spin.
    let ran = common::reported(v, "ran_ns") as f64;
    let spin = common::reported(v, "spin_ns") as f64;
    assert!(
        (ran / spin - 0.25).abs() <= 0.02,
        "guest ran {ran} of {spin}"
    );
    let g = &out.report.groups[0];
    assert_eq!(g.name, "vm");
    assert!(g.periods >= 19, "{g:?}");
    assert!(g.throttled_periods >= g.periods - 1, "{g:?}");
    assert_eq!(
        g.limited_ns, t.limited_ns,
        "the group's limited time is its member's"
    );
}

#[test]
fn a_group_limit_leaves_other_vcpus_alone() {
    let _g = common::serial();
    let out = run(3, "busy:ms=2000", None, &["a:0-1:50%"]);
    let vc = &out.report.vcpus;
    let wall = vc.iter().map(|v| v.times.wall_ns).max().unwrap() as f64;
    let group_used = (vc[0].times.used_ns + vc[1].times.used_ns) as f64;
    assert!(
        (group_used / wall - 0.5).abs() <= 0.02,
        "group a used {:.2} % of one CPU, not 50 %",
        group_used / wall * 100.0
    );
    assert_eq!(vc[2].times.limited_ns, 0, "vCPU 2 is in no group");
    assert!(vc[0].times.limited_ns > 0 && vc[1].times.limited_ns > 0);
    // Max-min fair: the two members got about the same.
    let (a, b) = (vc[0].times.used_ns as f64, vc[1].times.used_ns as f64);
    assert!((a - b).abs() / (a + b) < 0.1, "members used {a} and {b}");
    for v in vc {
        common::assert_identity(&out.report, v);
    }
}

#[test]
fn a_vm_limit_of_100_percent_holds_four_busy_vcpus_to_one_cpu() {
    let _g = common::serial();
    let out = run(4, "busy:ms=1500", Some("100%"), &[]);
    let vc = &out.report.vcpus;
    let wall = vc.iter().map(|v| v.times.wall_ns).max().unwrap() as f64;
    let used: u64 = vc.iter().map(|v| v.times.used_ns).sum();
    assert!(
        (used as f64 / wall - 1.0).abs() <= 0.02,
        "the VM used {:.3} CPUs, not 1",
        used as f64 / wall
    );
    for v in vc {
        common::assert_identity(&out.report, v);
    }
}

struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    fn call(&mut self, req: Value) -> Value {
        writeln!(self.writer, "{req}").unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            let v: Value = serde_json::from_str(&line).unwrap();
            if v.get("event").is_none() {
                return v;
            }
        }
    }

    fn vcpu0(&mut self) -> (u64, u64, u64) {
        let r = self.call(json!({"cmd": "stats"}));
        let v = &r["result"]["vcpus"][0];
        let f = |k: &str| v[k].as_u64().unwrap();
        (f("wall_ns"), f("used_ns"), f("limited_ns"))
    }

    /// Share of wall used over `ms`, and limited time in it.
    fn share_over(&mut self, ms: u64) -> (f64, u64) {
        let (w0, u0, l0) = self.vcpu0();
        std::thread::sleep(Duration::from_millis(ms));
        let (w1, u1, l1) = self.vcpu0();
        ((u1 - u0) as f64 / (w1 - w0) as f64, l1 - l0)
    }
}

#[test]
fn limits_change_at_run_time_through_the_socket() {
    common::require_kvm();
    let _g = common::serial();
    let dir = std::env::temp_dir().join(format!("ppa-limits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s");
    let child = Command::new(env!("CARGO_BIN_EXE_ppa-vmm"))
        .args(["run", "--vcpus", "1", "--workload", "busy:ms=60000"])
        .args(["--report", "json", "--max-runtime", "60", "--api-sock"])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stream = common::vmm::connect_when_up(&sock);
    let mut c = Client {
        writer: stream.try_clone().unwrap(),
        reader: BufReader::new(stream),
    };
    std::thread::sleep(Duration::from_millis(300));
    let (free, limited) = c.share_over(300);
    assert!(free > 0.8 && limited == 0, "unlimited: {free}, {limited}");

    // A new limit applies at once; measured from two periods later.
    let r = c.call(json!({"cmd": "set-limit", "group": "vm", "limit": "25%"}));
    assert_eq!(r["ok"], json!(true), "{r}");
    std::thread::sleep(Duration::from_millis(200));
    let (share, limited) = c.share_over(1000);
    assert!((share - 0.25).abs() <= 0.02, "at 25 %: {share}");
    assert!(limited > 0);

    // Throttle events reach a subscriber.
    let ev = UnixStream::connect(&sock).unwrap();
    let mut ev_writer = ev.try_clone().unwrap();
    let mut ev_reader = BufReader::new(ev);
    writeln!(
        ev_writer,
        r#"{{"cmd":"subscribe","events":["throttle-start","throttle-end"]}}"#
    )
    .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let mut line = String::new();
    while seen.len() < 2 {
        line.clear();
        ev_reader.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        if let Some(e) = v["event"].as_str() {
            assert_eq!(v["group"], json!("vm"), "{v}");
            seen.insert(e.to_string());
        }
    }
    drop(ev_writer);

    // A bad change is refused and the old limit stays.
    let r = c.call(json!({"cmd": "set-limit", "group": "vm", "limit": "0%"}));
    assert_eq!(r["error"]["kind"], json!("bad-limit"), "{r}");
    let r = c.call(json!({"cmd": "set-limit", "group": "nope", "limit": "10%"}));
    assert_eq!(r["error"]["kind"], json!("bad-limit"), "{r}");
    let r = c.call(json!({"cmd": "groups"}));
    assert_eq!(r["result"][0]["limit"], json!("25%"), "{r}");

    // A change takes effect at the next period boundary: within two periods.
    c.call(json!({"cmd": "set-limit", "group": "vm", "limit": "50%"}));
    std::thread::sleep(Duration::from_millis(200));
    let (share, _) = c.share_over(1000);
    assert!((share - 0.5).abs() <= 0.02, "at 50 %: {share}");

    // Removing the limit ends throttling.
    c.call(json!({"cmd": "set-limit", "group": "vm", "limit": "none"}));
    std::thread::sleep(Duration::from_millis(200));
    let (share, limited) = c.share_over(500);
    assert!(share > 0.8, "unlimited again: {share}");
    assert_eq!(limited, 0, "no limited time without a limit");

    c.call(json!({"cmd": "shutdown"}));
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["groups"][0]["name"], json!("vm"));
    assert!(report["groups"][0]["throttled_periods"].as_u64().unwrap() >= 15);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_cgroup_backend_reports_the_cgroups_own_figures() {
    let _g = common::serial();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("the cgroup backend writes under /sys/fs/cgroup and needs root (CI runs as root)");
    }
    let out = run_opts(RunOptions {
        vcpus: Some(1),
        workload: vec!["busy:ms=1500".into()],
        cpu_limit: Some("25%".into()),
        limit_backend: Some(ppa_vmm::limits::limiter::Backend::Cgroup),
        max_runtime: Some(60.0),
        ..Default::default()
    });
    let g = &out.report.groups[0];
    assert_eq!(g.backend, ppa_vmm_api::LimitBackend::Cgroup);
    assert!(g.periods >= 10 && g.throttled_periods >= 10, "{g:?}");
    assert!(
        g.limited_ns > 500_000_000,
        "the cgroup's throttled time: {g:?}"
    );
    let t = &out.report.vcpus[0].times;
    let share = t.used_ns as f64 / t.wall_ns as f64;
    assert!(
        (share - 0.25).abs() <= 0.05,
        "CFS held it to {:.2} %",
        share * 100.0
    );
    // The kernel's throttling is not the VMM's: the vCPU has no limited time, and the time
    // it was held back shows as run-queue wait.
    assert_eq!(t.limited_ns, 0);
    assert!(t.steal_ns > t.wall_ns / 2, "{t:?}");
}

fn run_opts(opts: RunOptions) -> RunOutcome {
    common::require_kvm();
    let (config, _) = opts.into_config().expect("valid config");
    Vm::try_from(config)
        .expect("VM builds")
        .run()
        .expect("VM runs")
}

#[test]
fn a_runaway_vcpu_is_held_to_the_throttle_limit() {
    let _g = common::serial();
    let out = run_opts(RunOptions {
        vcpus: Some(1),
        workload: vec!["busy:ms=2000".into()],
        runaway: Some(100.0),
        overload_action: Some("throttle:25%".into()),
        max_runtime: Some(60.0),
        ..Default::default()
    });
    let v = &out.report.vcpus[0];
    assert_eq!(v.times.overloads, 1, "one runaway");
    let g = out
        .report
        .groups
        .iter()
        .find(|g| g.name == "runaway-0")
        .expect("the throttle applied as limit runaway-0");
    assert!(g.periods >= 15, "{g:?}");
    let share = g.used_ns as f64 / (g.periods * g.period_ns) as f64;
    assert!(
        (share - 0.25).abs() <= 0.02,
        "held to {:.2} %",
        share * 100.0
    );
    assert!(v.times.limited_ns > 1_000_000_000, "{:?}", v.times);
    common::assert_identity(&out.report, v);
}

#[test]
fn a_runaway_with_notify_raises_exactly_one_overload_event() {
    common::require_kvm();
    let _g = common::serial();
    let dir = std::env::temp_dir().join(format!("ppa-runaway-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s");
    // 300 ms, not 100: the test must subscribe before the first guest run gets that long.
    let child = Command::new(env!("CARGO_BIN_EXE_ppa-vmm"))
        .args(["run", "--vcpus", "2", "--workload", "0=busy:ms=1500"])
        .args([
            "--workload",
            "1=periodic:run_us=300,period_us=3000,count=400",
        ])
        .args(["--runaway", "300", "--report", "json", "--api-sock"])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stream = common::vmm::connect_when_up(&sock);
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    writeln!(
        writer,
        r#"{{"cmd":"subscribe","events":["overload","vm-exit"]}}"#
    )
    .unwrap();
    let mut overloads = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        let v: Value = serde_json::from_str(&line).unwrap();
        match v["event"].as_str() {
            Some("overload") => overloads.push(v),
            Some("vm-exit") => break,
            _ => {}
        }
    }
    assert_eq!(overloads.len(), 1, "{overloads:?}");
    assert_eq!(
        overloads[0]["vcpu"],
        json!(0),
        "the busy vCPU, not the periodic one"
    );
    assert_eq!(overloads[0]["kind"], json!("runaway"));
    assert_eq!(overloads[0]["action"], json!("notify"));
    let out = child.wait_with_output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["vcpus"][0]["overloads"], json!(1));
    assert_eq!(report["vcpus"][1]["overloads"], json!(0));
    assert_eq!(
        report["vcpus"][0]["limited_ns"],
        json!(0),
        "notify does not throttle"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_limits_are_refused_at_start() {
    common::require_kvm();
    let cases: [(&[&str], &str); 13] = [
        (&["--runaway", "0"], "not a runaway threshold"),
        (&["--overload", "90"], "not an overload rule"),
        (&["--overload", "0:3"], "not an overload rule"),
        (&["--overload-action", "kill"], "not an overload action"),
        (&["--cpu-limit", "0%"], "no CPU time"),
        (&["--cpu-limit=-5%"], "not a CPU limit"),
        (&["--cpu-limit", "abc"], "not a CPU limit"),
        (&["--cpu-limit", "1ms/500us"], "between 1 ms and 1 s"),
        (&["--cpu-limit", "1ms/2s"], "between 1 ms and 1 s"),
        (&["--cpu-limit", "300%"], "more than 2 vCPU"),
        (&["--vcpu-group", "a:5:50%"], "names vCPU 5"),
        (
            &["--vcpu-group", "a:0-1:50%", "--vcpu-group", "b:1:10%"],
            "in both group",
        ),
        (
            &["--vcpu-group", "a:0:50%", "--vcpu-group", "a:1:10%"],
            "two groups named",
        ),
    ];
    for (args, needle) in cases {
        let o = Command::new(env!("CARGO_BIN_EXE_ppa-vmm"))
            .args(["run", "--vcpus", "2", "--workload", "idle:ms=1"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
