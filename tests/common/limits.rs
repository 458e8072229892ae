//! Runs of VMs under CPU limits, shared by the functional and the accuracy limit tests.

use ppa_vmm::config::RunOptions;
use ppa_vmm::vm::{RunOutcome, Vm};

/// Builds and runs a VM from `opts`; panics on setup errors.
pub fn run_opts(opts: RunOptions) -> RunOutcome {
    super::require_kvm();
    let (config, _) = opts.into_config().expect("valid config");
    Vm::try_from(config)
        .expect("VM builds")
        .run()
        .expect("VM runs")
}

/// Runs `vcpus` vCPUs of `workload` under an optional VM limit and `groups` (60 s at most).
pub fn run_limited(
    vcpus: usize,
    workload: &str,
    cpu_limit: Option<&str>,
    groups: &[&str],
) -> RunOutcome {
    run_opts(RunOptions {
        vcpus: Some(vcpus),
        workload: vec![workload.to_string()],
        cpu_limit: cpu_limit.map(str::to_string),
        vcpu_group: groups.iter().map(|s| s.to_string()).collect(),
        max_runtime: Some(60.0),
        ..Default::default()
    })
}

/// Runs one busy vCPU for 1.5 s under a VM `limit` enforced by the cgroup backend; fails with
/// a message unless this runs as root (the backend writes under /sys/fs/cgroup; CI is root).
pub fn run_cgroup_limited(limit: &str) -> RunOutcome {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("the cgroup backend writes under /sys/fs/cgroup and needs root (CI runs as root)");
    }
    run_opts(RunOptions {
        vcpus: Some(1),
        workload: vec!["busy:ms=1500".into()],
        cpu_limit: Some(limit.into()),
        limit_backend: Some(ppa_vmm_api::LimitBackend::Cgroup),
        max_runtime: Some(60.0),
        ..Default::default()
    })
}

/// Runs one busy vCPU for 2 s, detected as a runaway after 100 ms and throttled to `limit`.
pub fn run_runaway_throttled(limit: &str) -> RunOutcome {
    run_opts(RunOptions {
        vcpus: Some(1),
        workload: vec!["busy:ms=2000".into()],
        runaway: Some(100.0),
        overload_action: Some(format!("throttle:{limit}")),
        max_runtime: Some(60.0),
        ..Default::default()
    })
}
