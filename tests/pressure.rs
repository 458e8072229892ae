//! VM pressure on real runs (docs/accounting.md, "Pressure"): busy vCPUs that outnumber the
//! host's CPUs stall `some` nearly all the time, a capped vCPU stalls `full` for the part of
//! its time the limit holds it, an idle VM hardly at all, and a trigger fires once per window
//! while a stall lasts and never while idle. Run one at a time (`common::serial`): the figures
//! are about contention, and another test's load would be part of it.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use std::io::{BufRead, BufReader, Write};

use common::vmm::{bin, connect_when_up, temp_dir};
use ppa_vmm::config::RunOptions;
use ppa_vmm::vm::Vm;
use ppa_vmm_api::PressureReport;
use serde_json::{json, Value};

fn run(opts: RunOptions) -> ppa_vmm::vm::RunOutcome {
    common::require_kvm();
    let (config, _) = opts.into_config().expect("valid config");
    Vm::try_from(config)
        .expect("VM builds")
        .run()
        .expect("VM runs")
}

fn pressure(out: &ppa_vmm::vm::RunOutcome) -> PressureReport {
    out.report
        .vm
        .pressure
        .clone()
        .expect("the report has pressure")
}

fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

#[test]
fn busy_vcpus_that_outnumber_the_host_cpus_stall_some_nearly_all_the_time() {
    let _one = common::serial();
    let vcpus = (2 * host_cpus()).min(16);
    let out = run(RunOptions {
        vcpus: Some(vcpus),
        workload: vec!["busy:ms=21000".into()],
        memory_mib: Some(64),
        max_runtime: Some(120.0),
        ..Default::default()
    });
    let p = pressure(&out);
    let uptime_us = out.report.vm.uptime_ns / 1000;
    let some = p.vm.some.total_us as f64 / uptime_us as f64;
    assert!(some >= 0.9, "some {some:.3} of {uptime_us} us: {p:?}");
    assert!(p.vm.some.avg10 >= 75.0, "{p:?}");
    // Between the bounds the vCPUs' own stalls set.
    let stalls: Vec<u64> = out
        .report
        .vcpus
        .iter()
        .map(|v| (v.times.steal_ns + v.times.limited_ns) / 1000)
        .collect();
    let max = *stalls.iter().max().unwrap();
    let tick = 8_000 * 2;
    assert!(p.vm.some.total_us + tick >= max, "{p:?} vs {stalls:?}");
    assert!(p.vm.full.total_us <= *stalls.iter().min().unwrap() + tick);
}

#[test]
fn a_capped_busy_vcpu_is_fully_stalled_while_its_limit_holds_it() {
    let _one = common::serial();
    let out = run(RunOptions {
        vcpus: Some(1),
        workload: vec!["busy:ms=1000".into()],
        cpu_limit: Some("25%".into()),
        memory_mib: Some(64),
        max_runtime: Some(120.0),
        ..Default::default()
    });
    let p = pressure(&out);
    let v = &out.report.vcpus[0].times;
    let wall_us = v.wall_ns / 1000;
    let full = p.vm.full.total_us as f64 / wall_us as f64;
    assert!((0.70..=0.80).contains(&full), "full {full:.3}: {p:?}");
    // One vCPU: some and full are its steal and limited time, less the first tick (the
    // tracker's base) and the part after the last one.
    assert_eq!(p.vm.some.total_us, p.vm.full.total_us);
    let stalled_us = (v.steal_ns + v.limited_ns) / 1000;
    let diff = stalled_us.abs_diff(p.vm.some.total_us);
    assert!(diff <= 30_000 + wall_us / 50, "{stalled_us} vs {p:?}");
}

#[test]
fn an_idle_vm_hardly_stalls() {
    let _one = common::serial();
    let out = run(RunOptions {
        vcpus: Some(2),
        workload: vec!["idle:ms=3000,publish=off".into()],
        memory_mib: Some(64),
        max_runtime: Some(120.0),
        ..Default::default()
    });
    let p = pressure(&out);
    let uptime_us = out.report.vm.uptime_ns / 1000;
    let some = p.vm.some.total_us as f64 / uptime_us as f64;
    // What stall there is, is the vCPUs' own: the run-queue wait of their wake-ups (every
    // 10 ms), which a loaded host makes long. On a quiet host that is well under 1 %.
    let steal_us: u64 = out
        .report
        .vcpus
        .iter()
        .map(|v| v.times.steal_ns / 1000)
        .sum();
    assert!(
        p.vm.some.total_us <= steal_us + 16_000,
        "{p:?} vs steal {steal_us} us"
    );
    let quiet = (steal_us as f64) < 0.005 * uptime_us as f64;
    assert!(
        !quiet || some < 0.01,
        "some {some:.4} with steal {steal_us} us: {p:?}"
    );
}

/// Starts a VM with a socket, subscribes a `some` trigger of 100 ms in 1 s, and collects its
/// events for `secs`.
fn trigger_events(args: &[&str], secs: u64) -> Vec<Value> {
    common::require_kvm();
    let d = temp_dir("pressure-trigger");
    let sock = d.as_path().join("api.sock");
    let mut child = Command::new(bin())
        .args([
            "run",
            "--guest",
            "tiny",
            "--report",
            "none",
            "--max-runtime",
            "60",
        ])
        .arg("--api-sock")
        .arg(&sock)
        .args(args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut s = connect_when_up(&sock);
    let req = json!({"id": 1, "cmd": "subscribe", "events": ["pressure"],
        "pressure": {"kind": "some", "threshold_us": 100_000, "window_us": 1_000_000}});
    s.write_all(format!("{req}\n").as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut r = BufReader::new(s);
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    let mut events = Vec::new();
    let mut line = String::new();
    while std::time::Instant::now() < until {
        match r.read_line(&mut line) {
            Ok(n) if n > 0 && line.ends_with('\n') => {
                let v: Value = serde_json::from_str(&line).unwrap();
                if v.get("event").is_some() {
                    events.push(v);
                } else {
                    assert_eq!(v["ok"], json!(true), "{v}");
                }
                line.clear();
            }
            _ => continue,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    events
}

#[test]
fn a_trigger_fires_once_per_window_while_the_stall_lasts_and_never_while_idle() {
    let _one = common::serial();
    // A busy vCPU held to 25 %: stalled 75 % of every window of 1 s.
    let events = trigger_events(&["--workload", "busy:ms=30000", "--cpu-limit", "25%"], 4);
    assert!((3..=5).contains(&events.len()), "{events:?}");
    let at: Vec<u64> = events
        .iter()
        .map(|e| e["uptime_ns"].as_u64().unwrap())
        .collect();
    for w in at.windows(2) {
        assert!(w[1] - w[0] >= 990_000_000, "at most one per window: {at:?}");
    }
    for e in &events {
        assert_eq!(
            (e["event"].as_str(), e["kind"].as_str()),
            (Some("pressure"), Some("some"))
        );
        assert!(e["stall_us"].as_u64().unwrap() > 100_000, "{e}");
    }
    // An idle VM: none.
    let events = trigger_events(&["--workload", "idle:ms=30000"], 3);
    assert!(events.is_empty(), "{events:?}");
}

/// The calling thread's CPU affinity set to `cpus` (children forked from it inherit it);
/// returns the set it had.
fn pin_self(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; sched_{get,set}affinity read and write one of the size
    // given, for the calling thread (pid 0).
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut old);
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(
            rc,
            0,
            "pinning to {cpus:?}: {}",
            std::io::Error::last_os_error()
        );
        old
    }
}

fn restore_affinity(set: &libc::cpu_set_t) {
    // SAFETY: as in `pin_self`.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
}

/// A cgroup v2 of its own holding one process, whose `cpu.pressure` is the kernel's own PSI
/// for exactly that process (docs/accounting.md, "Pressure", says where its definition and
/// ours agree).
struct KernelPsi {
    dir: std::path::PathBuf,
    root: std::path::PathBuf,
    pid: u32,
}

impl KernelPsi {
    /// Moves `pid` into a new cgroup under the cgroup v2 mount, or says why not.
    fn new(pid: u32) -> Result<KernelPsi, String> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").map_err(|e| e.to_string())?;
        let root = mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.len() > 2 && f[2] == "cgroup2")
            .map(|f| std::path::PathBuf::from(f[1]))
            .ok_or("no cgroup v2 hierarchy is mounted")?;
        if !root.join("cpu.pressure").exists() {
            return Err(format!("{} has no cpu.pressure (PSI off)", root.display()));
        }
        let dir = root.join(format!("ppa-test-pressure-{pid}"));
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let psi = KernelPsi { dir, root, pid };
        std::fs::write(psi.dir.join("cgroup.procs"), pid.to_string())
            .map_err(|e| format!("moving {pid} into {}: {e}", psi.dir.display()))?;
        Ok(psi)
    }

    /// (some, full) totals in µs, and the CPU time of the group's threads in µs.
    fn read(&self) -> (u64, u64, u64) {
        let text = std::fs::read_to_string(self.dir.join("cpu.pressure")).unwrap();
        let total = |kind: &str| {
            text.lines()
                .find(|l| l.starts_with(kind))
                .and_then(|l| l.rsplit("total=").next())
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0)
        };
        let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).unwrap();
        let usage = stat
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        (total("some"), total("full"), usage)
    }
}

impl Drop for KernelPsi {
    fn drop(&mut self) {
        let _ = std::fs::write(self.root.join("cgroup.procs"), self.pid.to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One look at a running VM's pressure, its vCPUs' CPU time and the kernel's PSI of its
/// cgroup.
#[derive(Debug, Clone, Copy)]
struct Look {
    /// `pressure`'s uptime_ns, some and full totals (µs) and whether it says estimated.
    uptime_ns: u64,
    some_us: u64,
    full_us: u64,
    estimated: bool,
    /// `stats`: its uptime_ns and the vCPUs' used_ns summed.
    stats_ns: u64,
    used_ns: u64,
    /// The kernel's (some, full) µs and the cgroup's CPU µs, and when they were read.
    kernel: Option<(u64, u64, u64)>,
    at: std::time::Instant,
}

fn look(c: &mut common::vmm::Conn, psi: Option<&KernelPsi>) -> Look {
    let p = c.ok(json!({"cmd": "pressure"}));
    let kernel = psi.map(KernelPsi::read);
    let at = std::time::Instant::now();
    let s = c.stats();
    Look {
        uptime_ns: p["uptime_ns"].as_u64().unwrap(),
        some_us: p["vm"]["some"]["total_us"].as_u64().unwrap(),
        full_us: p["vm"]["full"]["total_us"].as_u64().unwrap(),
        estimated: p["vm"]["estimated"].as_bool().unwrap(),
        stats_ns: s.vm.uptime_ns,
        used_ns: s.vcpus.iter().map(|v| v.used_ns).sum(),
        kernel,
        at,
    }
}

/// Shares of a window between two looks: (some, full) by our pressure, the vCPUs' CPU time
/// over the window, the kernel's (some, full), and the CPU time of the VMM's other threads
/// over the window (the cgroup's less the vCPUs').
#[derive(Debug)]
struct Window {
    some: f64,
    full: f64,
    used: f64,
    kernel: Option<(f64, f64)>,
    others: Option<f64>,
    secs: f64,
}

fn window(a: &Look, b: &Look) -> Window {
    let dp = (b.uptime_ns - a.uptime_ns) as f64;
    let ds = (b.stats_ns - a.stats_ns) as f64;
    let dk = (b.at - a.at).as_nanos() as f64;
    Window {
        some: (b.some_us - a.some_us) as f64 * 1e3 / dp,
        full: (b.full_us - a.full_us) as f64 * 1e3 / dp,
        used: (b.used_ns - a.used_ns) as f64 / ds,
        kernel: a.kernel.zip(b.kernel).map(|(ka, kb)| {
            (
                (kb.0 - ka.0) as f64 * 1e3 / dk,
                (kb.1 - ka.1) as f64 * 1e3 / dk,
            )
        }),
        others: a.kernel.zip(b.kernel).map(|(ka, kb)| {
            ((kb.2 - ka.2) as f64 * 1e3 / dk - (b.used_ns - a.used_ns) as f64 / ds).max(0.0)
        }),
        secs: dp / 1e9,
    }
}

/// Runs `vcpus` busy vCPUs at `level` with the VMM pinned to `cpus` (and, with `hog`, a
/// thread of this test spinning on that CPU beside it) in a cgroup of its own; returns the
/// window of 3 s it measured, both looks, and the VM's `metrics` text.
fn pinned_run(
    vcpus: usize,
    level: &str,
    cpus: &[usize],
    hog: Option<usize>,
) -> (Window, Look, String) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hog = hog.map(|cpu| {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            pin_self(&[cpu]);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    });
    let old = pin_self(cpus);
    let vcpus = vcpus.to_string();
    let vmm = common::vmm::Vmm::start(
        "pressure-pinned",
        &[
            "--vcpus",
            &vcpus,
            "--workload",
            "busy:ms=6000",
            "--memory-mib",
            "64",
            "--accounting",
            level,
        ],
    );
    restore_affinity(&old);
    let psi = match KernelPsi::new(vmm.pid()) {
        Ok(p) => Some(p),
        Err(why) => {
            eprintln!("no kernel PSI to compare with: {why}");
            None
        }
    };
    let mut c = vmm.connect();
    std::thread::sleep(Duration::from_millis(1200));
    let a = look(&mut c, psi.as_ref());
    std::thread::sleep(Duration::from_secs(3));
    let b = look(&mut c, psi.as_ref());
    let metrics = c
        .ok(json!({"cmd": "metrics"}))
        .as_str()
        .unwrap()
        .to_string();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(h) = hog {
        h.join().unwrap();
    }
    drop(c);
    let (code, _) = { vmm }.shutdown();
    assert_eq!(code, 0);
    drop(psi);
    (window(&a, &b), b, metrics)
}

#[test]
fn four_busy_vcpus_on_two_cpus_have_no_full_pressure_at_level_full_and_say_so_at_basic() {
    let _one = common::serial();
    common::require_kvm();
    if host_cpus() < 2 {
        eprintln!("needs two host CPUs");
        return;
    }
    // Two vCPUs always run and two always wait: `some` is the whole window and `full` is 0,
    // up to the time something else held both CPUs (the host's other work: a bound from the
    // vCPUs' own CPU time, (2 − used) / 2 of the window).
    let (w, b, metrics) = pinned_run(4, "full", &[0, 1], None);
    eprintln!("4 busy vCPUs on CPUs 0-1, level full: {w:?}");
    assert!(!b.estimated, "level full measures: {b:?}");
    assert!(
        metrics.contains("ppa_vm_pressure_estimated{vm="),
        "{metrics}"
    );
    assert!(metrics
        .lines()
        .any(|l| l.starts_with("ppa_vm_pressure_estimated{") && l.ends_with(" 0")));
    // The bounds are a quiet host's: where other work held the two CPUs for more than a tenth
    // of the window (the vCPUs used under 1.8 of them), they are not checked.
    let quiet = w.used >= 1.8;
    if !quiet {
        eprintln!(
            "host busy (vCPUs used {:.2} of 2 CPUs): the quiet host's bounds are not checked",
            w.used
        );
    }
    assert!(!quiet || w.some >= 0.995, "{w:?}");
    let others = ((2.0 - w.used) / 2.0).max(0.0);
    assert!(!quiet || w.full <= 0.005 + others, "{w:?}");
    // Where the kernel names the thread it picks at each switch (`sched:sched_switch`), a
    // vCPU's wait ends there, not at its switch-in record written after the switch: the two
    // CPUs' switches between vCPUs at each scheduler tick no longer read as every vCPU
    // waiting (before, 0.25-0.52 % of the window here; since, 0.008-0.017 %), and `full` stays
    // well under the 0.5 % issue 37 asks for where other work took under a twentieth of the
    // CPUs.
    let handoffs = std::path::Path::new("/sys/kernel/tracing/events/sched/sched_switch").exists();
    if handoffs && w.used >= 1.9 {
        assert!(w.full < 0.003, "{w:?}");
    }
    if let Some((ksome, _)) = w.kernel {
        // The kernel's `some` of a cgroup is, per CPU, a task of the group waiting there,
        // averaged over the CPUs (weighted by their non-idle time). Ours is a vCPU waiting
        // anywhere, so the kernel's is never more than ours: a CPU whose group tasks all run
        // counts none there. The two agree with two vCPUs waiting on each CPU; the load
        // balancer does not always keep them two and two (measured on the development host:
        // kernel 0.954-1.000 over 3 s windows, the VMM's other threads taking 4 % of a CPU),
        // so only the bound is checked.
        eprintln!("kernel some {ksome:.3}, ours {:.3}", w.some);
        assert!(ksome <= w.some + 0.01, "{w:?}");
    }
    // The same at level basic: the overlap rule, and every output says it is an estimate.
    let (w, b, metrics) = pinned_run(4, "basic", &[0, 1], None);
    eprintln!("4 busy vCPUs on CPUs 0-1, level basic: {w:?}");
    assert!(b.estimated, "{b:?}");
    assert!(metrics
        .lines()
        .any(|l| l.starts_with("ppa_vm_pressure_estimated{") && l.ends_with(" 1")));
}

#[test]
fn two_busy_vcpus_on_one_cpu_beside_a_hog_stall_fully_while_the_hog_runs() {
    let _one = common::serial();
    common::require_kvm();
    let cpu = host_cpus() - 1;
    // Both vCPUs on one CPU: never both on it, so the time neither runs, both waiting, is the
    // window less their CPU time (the hog's share, and the VMM's other threads'): `full` from
    // the vCPU threads' own CPU clocks, not from the records pressure is made of.
    let (w, b, _) = pinned_run(2, "full", &[cpu], Some(cpu));
    eprintln!("2 busy vCPUs and a hog on CPU {cpu}, level full: {w:?}");
    assert!(!b.estimated, "{b:?}");
    let truth = 1.0 - w.used;
    assert!(truth > 0.2, "the hog ran beside them: {w:?}");
    // A quiet host gives the vCPUs half the CPU beside the hog; where other work took a fifth
    // of it (used below 0.4) the bounds are not checked.
    if w.used < 0.4 {
        eprintln!(
            "host busy (vCPUs used {:.2} of the CPU beside the hog): the bounds are not checked",
            w.used
        );
        return;
    }
    let tolerance = 0.01 + 0.016 / w.secs;
    assert!(
        (w.full - truth).abs() <= tolerance,
        "full {:.4} vs {truth:.4}: {w:?}",
        w.full
    );
    assert!(w.some >= 0.99, "{w:?}");
    if let Some((ksome, kfull)) = w.kernel {
        // Everything of the VMM on one CPU: the kernel's per-CPU figures are the whole, and
        // its `some` is ours (a task of the group waiting). Its `full` is every runnable task
        // of the group waiting, and the group also holds the VMM's other threads: while one
        // of them runs with both vCPUs waiting, ours counts `full` and the kernel's does not.
        // So ours is the kernel's plus at most those threads' CPU time (measured: the
        // sampler's and the socket's, 2-4 % of the window at level full), never less.
        let others = w.others.unwrap_or(0.0);
        assert!((w.some - ksome).abs() <= 0.03, "{w:?}");
        assert!(w.full >= kfull - 0.01, "{w:?}");
        assert!(w.full <= kfull + others + 0.01, "{w:?}");
    }
}
