//! Helpers shared by the end-to-end tests: KVM presence, one-at-a-time runs, report access.

#![allow(dead_code)]

pub mod limits;
pub mod nested;
pub mod netns;
pub mod page;
pub mod prom;
pub mod vmm;

use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;

use ppa_vmm::accounting::Level;
use ppa_vmm::config::RunOptions;
use ppa_vmm::handle::VmHandle;
use ppa_vmm::report::{Report, VcpuReport};
use ppa_vmm::vm::{RunOutcome, Vm};
use ppa_vmm_api::{GuestThreadView, GuestView};

static SERIAL: Mutex<()> = Mutex::new(());

/// Fails with a clear message where this host has no usable /dev/kvm.
pub fn require_kvm() {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        panic!(
            "this test boots a VM and needs read-write access to /dev/kvm, which failed: {e}. \
             Run the KVM tests on a host with KVM (CI has it)."
        );
    }
}

/// Runs VMs one at a time in this test binary: accuracy figures need an otherwise idle host,
/// and functional tests that sleep a set time while a VM runs are steadier without company.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Builds and runs a VM from `vcpus` and workload specs; panics on setup errors.
pub fn run_vm(vcpus: usize, workloads: &[&str]) -> RunOutcome {
    run_vm_at(vcpus, workloads, Level::Basic)
}

/// Builds a VM at accounting `level`.
pub fn build_vm(vcpus: usize, workloads: &[&str], level: Level) -> Vm {
    require_kvm();
    let opts = RunOptions {
        vcpus: Some(vcpus),
        workload: workloads.iter().map(|s| s.to_string()).collect(),
        max_runtime: Some(120.0),
        accounting: Some(level),
        memory_mib: Some(64),
        ..Default::default()
    };
    let (config, _) = opts.into_config().expect("valid config");
    Vm::try_from(config).expect("VM builds")
}

/// Builds and runs a VM at accounting `level` with the kernel's tracepoints on or off (level
/// full opens them; tracefs must be mounted: [`require_tracefs`]).
pub fn run_vm_traced(vcpus: usize, workloads: &[&str], level: Level, trace: bool) -> RunOutcome {
    require_kvm();
    let opts = RunOptions {
        vcpus: Some(vcpus),
        workload: workloads.iter().map(|s| s.to_string()).collect(),
        max_runtime: Some(120.0),
        accounting: Some(level),
        memory_mib: Some(64),
        kernel_trace: Some(trace),
        ..Default::default()
    };
    let (config, _) = opts.into_config().expect("valid config");
    Vm::try_from(config)
        .expect("VM builds")
        .run()
        .expect("VM runs")
}

/// Mounts tracefs at /sys/kernel/tracing where no tracefs is mounted (the kernel tracepoints
/// of level full are found there; a host without it gets a reason instead of kvm_ns and
/// interrupted_ns, which the tests that need the figures cannot use).
pub fn require_tracefs() {
    let mounted = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|p| std::path::Path::new(p).join("events").is_dir());
    if mounted {
        return;
    }
    let out = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .output()
        .expect("mount runs");
    assert!(
        out.status.success(),
        "this test needs tracefs (the kernel's tracepoint ids) and could not mount it at \
         /sys/kernel/tracing: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The KVM backend module of this host (`kvm_intel`, `kvm_amd`, `kvm_pvm`).
pub fn kvm_backend() -> Option<&'static str> {
    ["kvm_intel", "kvm_amd", "kvm_pvm"]
        .into_iter()
        .find(|m| std::path::Path::new("/sys/module").join(m).exists())
}

/// Builds and runs a VM at accounting `level`.
pub fn run_vm_at(vcpus: usize, workloads: &[&str], level: Level) -> RunOutcome {
    build_vm(vcpus, workloads, level).run().expect("VM runs")
}

/// Runs one busy vCPU alone for `ms`; returns the outcome and the guest's spin_ns and lost_ns.
pub fn run_busy_alone(ms: u64) -> (RunOutcome, u64, u64) {
    let out = run_vm(1, &[&format!("busy:ms={ms}")]);
    assert_all_exited_ok(&out.report);
    let v = &out.report.vcpus[0];
    let (spin, lost) = (reported(v, "spin_ns"), reported(v, "lost_ns"));
    (out, spin, lost)
}

/// Builds a VM at accounting `level` and runs it on a thread of its own: its handle, and the
/// thread, which returns the outcome.
pub fn spawn_vm(
    vcpus: usize,
    workloads: &[&str],
    level: Level,
) -> (VmHandle, JoinHandle<RunOutcome>) {
    let vm = build_vm(vcpus, workloads, level);
    let handle = vm.handle();
    (
        handle,
        std::thread::spawn(move || vm.run().expect("VM runs")),
    )
}

/// The reset tests' VM: a busy vCPU beside a periodic one, both about 0.9 s long.
pub const RESET_WORKLOADS: [&str; 2] = [
    "0=busy:ms=900",
    "1=periodic:run_us=300,period_us=3000,count=300",
];

/// The pause tests' VM: a busy vCPU beside a periodic one, both about 0.6 s long.
pub const PAUSE_WORKLOADS: [&str; 2] = [
    "0=busy:ms=600",
    "1=periodic:run_us=300,period_us=3000,count=200",
];

/// Starts the pause tests' VM and pauses it after 150 ms of run: its handle and its thread.
pub fn spawn_and_pause() -> (VmHandle, JoinHandle<RunOutcome>) {
    let (handle, runner) = spawn_vm(2, &PAUSE_WORKLOADS, Level::Basic);
    std::thread::sleep(std::time::Duration::from_millis(150));
    handle.pause();
    (handle, runner)
}

/// Asserts the identity of spec section 4 for a stopped vCPU, with a readable message.
///
/// The development and CI hosts are themselves VMs: time their hypervisor steals while a vCPU
/// thread runs is excluded from the kernel's task clock and is not run-queue wait either, so it
/// is missing from the sum. The report measures that steal (`vm.host_steal_ns`, /proc/stat, in
/// 10 ms ticks); a shortfall up to it, plus one tick per host CPU for rounding, is allowed.
pub fn assert_identity(r: &Report, v: &VcpuReport) {
    let t = &v.times;
    let host_steal = r.vm.host_steal_ns.unwrap_or(0);
    assert!(
        identity_explained(t.wall_ns, t.identity_error_ns, host_steal),
        "identity fails for vCPU {} ({}): wall {} vs used {} + steal {} + halted {} + idle {} + \
         limited {} + paused {} + blocked {} (error {} ns, host steal {host_steal} ns)",
        v.times.id,
        v.tiny().map_or("", |t| t.workload.as_str()),
        t.wall_ns,
        t.used_ns,
        t.steal_ns,
        t.halted_ns,
        t.idle_ns,
        t.limited_ns,
        t.paused_ns,
        t.blocked_ns,
        t.identity_error_ns
    );
}

/// Whether a stopped vCPU's identity error is within spec section 4's tolerance, or is a
/// shortfall that the host's own steal (`vm.host_steal_ns`) explains (see [`assert_identity`]).
pub fn identity_explained(wall_ns: u64, error_ns: i64, host_steal_ns: u64) -> bool {
    let slack = if host_steal_ns > 0 {
        host_steal_ns + 20_000_000
    } else {
        0
    };
    ppa_vmm_api::identity_within(wall_ns, error_ns, true)
        || (error_ns > 0 && (error_ns as u64) <= slack)
}

/// The value the guest reported under `key`.
pub fn reported(v: &VcpuReport, key: &str) -> u64 {
    *v.tiny()
        .expect("a tiny guest")
        .guest_reported
        .get(key)
        .unwrap_or_else(|| {
            panic!(
                "vCPU {} did not report {key}: {:?}",
                v.times.id,
                v.tiny().map(|t| &t.guest_reported)
            )
        })
}

/// The thread record named `name` in a decoded guest section.
pub fn guest_thread<'a>(g: &'a GuestView, name: &str) -> &'a GuestThreadView {
    g.threads
        .iter()
        .find(|t| t.comm == name)
        .unwrap_or_else(|| panic!("no thread record named {name}: {g:?}"))
}

/// Asserts every vCPU exited with code 0.
pub fn assert_all_exited_ok(r: &Report) {
    for v in &r.vcpus {
        assert_eq!(
            v.exit_code,
            Some(0),
            "vCPU {} ({}) ended {} with {:?}",
            v.times.id,
            v.tiny().map_or("", |t| t.workload.as_str()),
            v.end,
            v.failure
        );
    }
}

/// The share of a busy host thread's time that its CPU spends elsewhere without the thread
/// being descheduled: interrupts, and on a nested host (the PVM development machines) the
/// outer hypervisor running other work. A thread spins on the monotonic clock for `ms` and
/// sums every gap longer than 2 µs (what a guest's rdtsc loop would count as lost). The
/// host's task clock charges these gaps to whatever thread was running, so a vCPU's
/// guest_ns includes them while the guest's own clock sees them as lost time.
pub fn platform_interrupt_share(ms: u64) -> f64 {
    let t0 = std::time::Instant::now();
    let end = t0 + std::time::Duration::from_millis(ms);
    let mut last = t0;
    let mut lost = std::time::Duration::ZERO;
    loop {
        let now = std::time::Instant::now();
        let d = now - last;
        if d > std::time::Duration::from_micros(2) {
            lost += d;
        }
        last = now;
        if now >= end {
            break;
        }
    }
    lost.as_secs_f64() / (last - t0).as_secs_f64()
}

/// Runs `f` between two 300 ms measurements of [`platform_interrupt_share`], one before and
/// one after (the share varies with the outer host's load): `f`'s result and their mean.
pub fn beside_platform<R>(f: impl FnOnce() -> R) -> (R, f64) {
    let before = platform_interrupt_share(300);
    let r = f();
    (r, (before + platform_interrupt_share(300)) / 2.0)
}
