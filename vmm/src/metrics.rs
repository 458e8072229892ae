//! Prometheus metrics: the VMM's figures in the text exposition format (version 0.0.4), with
//! OpenMetrics-style names (base units, counters ending in `_total`), served from a cache.
//!
//! This module owns the mapping from [`Detailed`] (the VM's figures, every vCPU's whole
//! `VcpuTimes` and histograms, the limits and the process's own figures; defined in
//! docs/accounting.md and docs/control.md) to metric families, the text encoding, and the
//! rendered-text cache. It touches no KVM state.
//!
//! Data flow: the API server's handler asks its [`Exporter`] for the text at every scrape (or
//! `metrics` command). The exporter serves the text it rendered last if that is younger than
//! the render interval (100 ms), else it collects a [`Detailed`] — reading every vCPU
//! ([`exporter::collect`]) and `/proc/self` ([`process`]) — and calls [`render`], which
//! declares the families of [`FAMILIES`] in order, adds every sample ([`families`]), and
//! writes each family that has a sample once ([`text`]). Histograms are mapped onto fixed `le` bounds by
//! [`buckets`]. The exporter appends its own families (renders, requests, render duration, and
//! the API server's counters once the server hands it a [`ServerCounters`]).
//!
//! Every sample carries the label `vm` (the VM's name, user-given, so escaped); per-vCPU
//! samples add `vcpu` (its index). Times are nanoseconds in [`Detailed`] and seconds here,
//! written as the exact decimal `ns / 1e9` (up to nine fractional digits, trailing zeros
//! dropped), so no precision is lost before the scraper parses them. Values that change while
//! the VM runs (VM state, accounting level, vCPU micro-state, split kind) are enum gauges (one
//! series per possible value, 1 for the current one, 0 for the others), never labels of an
//! `_info` family.

mod buckets;
mod devices;
mod exporter;
mod families;
pub mod guest;
mod process;
mod text;

use ppa_vmm_api::{DeviceStats, GroupStats, VcpuTimes, VmStats};

use crate::accounting::snapshot::HistSnapshots;
pub use exporter::Exporter;
#[allow(
    unused_imports,
    reason = "the API server's hook (issue 17): see exporter's doc"
)]
pub use exporter::{Listener, ServerCounters};
pub use process::ProcessReading;
use text::{Decl, Families, Kind};

/// Content type to serve it with over HTTP.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One vCPU's figures: its whole record and its histograms.
#[derive(Debug, Clone)]
pub struct VcpuDetail {
    /// The section 4 record.
    pub times: VcpuTimes,
    /// Its histograms (exit handling by reason and overall, guest runs, wake-up latency).
    pub hist: HistSnapshots,
}

/// What the metrics are rendered from: the VM's figures and every vCPU's full record (the
/// control socket's `stats` carries only summaries; metrics want the estimates, KVM exits,
/// migrations, thresholds and histograms too).
#[derive(Debug, Clone)]
pub struct Detailed {
    /// The VM.
    pub vm: VmStats,
    /// Every vCPU.
    pub vcpus: Vec<VcpuDetail>,
    /// Every CPU limit.
    pub groups: Vec<GroupStats>,
    /// Every device.
    pub devices: Vec<DeviceStats>,
    /// The VMM process itself (`None`: no `process_*` families).
    pub process: Option<ProcessReading>,
    /// Each vCPU group's CPU pressure (the VM's is in `vm`).
    pub pressure_groups: Vec<ppa_vmm_api::GroupPressure>,
    /// What the guest published in the PPA page (`None`: the VM has no page).
    pub guest: Option<guest::Guest>,
}

/// Shorthand for the table.
const fn d(name: &'static str, kind: Kind, help: &'static str) -> Decl {
    Decl { name, kind, help }
}

/// Every family [`render`] may write, in output order. docs/control.md defines each one.
pub const FAMILIES: &[Decl] = {
    use Kind::{Counter, Gauge, Histogram};
    &[
        d("ppa_vmm_build_info", Gauge, "Always 1; labels give the VMM version, the git commit it was built from, the control protocol version and the guest ABI version."),
        d("ppa_vm_info", Gauge, "Always 1; the label pid gives the VMM process id."),
        d("ppa_vm_state", Gauge, "1 for the VM's current state, 0 for the others."),
        d("ppa_vm_accounting_level", Gauge, "1 for the accounting level in force, 0 for the others."),
        d("ppa_vm_uptime_seconds", Gauge, "Time since the vCPUs were started."),
        d("ppa_vm_vcpus", Gauge, "Number of vCPUs."),
        d("ppa_vm_host_threads_seconds_total", Counter, "CPU time of every non-vCPU thread of the VMM process."),
        d("ppa_vm_host_cpu_seconds_total", Counter, "CPU time of the VMM process by part: vcpus (the vCPU threads), devices (the device threads), service (every other thread)."),
        d("ppa_vm_pressure_some_seconds_total", Counter, "Time at least one non-idle vCPU was stalled (waiting for a host CPU or held by a limit), since the VM started; an ESTIMATE where ppa_vm_pressure_estimated is 1."),
        d("ppa_vm_pressure_full_seconds_total", Counter, "Time every non-idle vCPU was stalled, at least one being non-idle, since the VM started; an ESTIMATE where ppa_vm_pressure_estimated is 1."),
        d("ppa_vm_pressure_avg_ratio", Gauge, "PSI's running averages of the VM's pressure (0 to 1), by kind (some, full) and window (10s, 60s, 300s); an ESTIMATE where ppa_vm_pressure_estimated is 1."),
        d("ppa_vm_pressure_estimated", Gauge, "1 when part of the VM's pressure figures is an ESTIMATE (the overlap rule, where the vCPUs' state intervals were not known: level basic), 0 when every tick was measured from them."),
        d("ppa_vm_threshold_seconds", Gauge, "Threshold in force, by name; 0 means off."),
        d("ppa_vm_exit_handling_duration_seconds", Histogram, "Userspace handling time of one exit, every vCPU, by reason (parks excluded)."),
        d("ppa_vm_kvm_exit_handling_duration_seconds", Histogram, "KVM's in-kernel handling time of one exit, every vCPU, by hardware reason (level full, KVM's tracepoints)."),
        d("ppa_vcpu_info", Gauge, "Always 1; the label host_tid gives the host thread id of the vCPU thread (0 before it started)."),
        d("ppa_vcpu_state", Gauge, "1 for the vCPU's micro-state at the read, 0 for the others."),
        d("ppa_vcpu_split", Gauge, "1 for how guest and VMM time were split over the exits counted, 0 for the others."),
        d("ppa_vcpu_wall_seconds_total", Counter, "Monotonic time elapsed since the vCPU thread started or was reset."),
        d("ppa_vcpu_used_seconds_total", Counter, "On-CPU time of the vCPU thread (guest + vmm)."),
        d("ppa_vcpu_guest_seconds_total", Counter, "On-CPU time inside KVM_RUN: guest code, plus KVM's exit handling and host interrupts where those are not measured apart (no kvm and interrupted series)."),
        d("ppa_vcpu_kvm_seconds_total", Counter, "On-CPU time inside KVM_RUN in KVM's exit handling, from KVM's tracepoints at level full (only where they fire)."),
        d("ppa_vcpu_interrupted_seconds_total", Counter, "On-CPU time in host hard and soft interrupts while the vCPU thread was current, from the interrupt tracepoints at level full (only where measured)."),
        d("ppa_vcpu_vmm_seconds_total", Counter, "On-CPU time in the VMM outside KVM_RUN."),
        d("ppa_vcpu_steal_seconds_total", Counter, "Time runnable but waiting for a host CPU (schedstat run_delay)."),
        d("ppa_vcpu_halted_seconds_total", Counter, "Time blocked inside KVM_RUN (in-kernel HLT)."),
        d("ppa_vcpu_idle_seconds_total", Counter, "Time parked because the guest asked to idle."),
        d("ppa_vcpu_limited_seconds_total", Counter, "Time parked because a CPU limit was exhausted."),
        d("ppa_vcpu_paused_seconds_total", Counter, "Time parked because an operator paused the VM."),
        d("ppa_vcpu_blocked_seconds_total", Counter, "Time off CPU and not runnable outside parks and halts (asleep in the kernel)."),
        d("ppa_vcpu_kvm_estimated_seconds_total", Counter, "ESTIMATE of the in-kernel exit handling inside guest time: KVM's exit count times the measured round-trip cost."),
        d("ppa_vcpu_guest_code_estimated_seconds_total", Counter, "ESTIMATE of guest code time: guest time minus the estimated in-kernel exit handling."),
        d("ppa_vcpu_kvm_run_wall_seconds_total", Counter, "Wall time inside KVM_RUN (timed accounting levels), steal and halted time included."),
        d("ppa_vcpu_park_cpu_seconds_total", Counter, "On-CPU time around parks (part of vmm time)."),
        d("ppa_vcpu_exits_total", Counter, "Exits to userspace, by reason (fatal reasons only once seen)."),
        d("ppa_vcpu_exit_handling_seconds_total", Counter, "Userspace exit handling wall time, by reason (parks excluded; fatal reasons only once seen)."),
        d("ppa_vcpu_kvm_stat_exits_total", Counter, "Every exit KVM counted, in-kernel ones included (KVM statistic exits)."),
        d("ppa_vcpu_kvm_exits_total", Counter, "Exits KVM handled in the kernel, by hardware reason (VMX/SVM names; KVM's tracepoints at level full, only where they fire)."),
        d("ppa_vcpu_kvm_exit_seconds_total", Counter, "On-CPU time KVM spent handling the exits it handled in the kernel, by hardware reason (interrupts excluded)."),
        d("ppa_vcpu_interrupts_total", Counter, "Host interrupts taken while the vCPU thread was current, by kind (level full, interrupt tracepoints)."),
        d("ppa_vcpu_migrations_total", Counter, "Host CPU changes seen between consecutive KVM_RUN entries."),
        d("ppa_vcpu_parks_total", Counter, "Parks of the vCPU thread (idle, limited, paused)."),
        d("ppa_vcpu_threshold_exceeded_total", Counter, "Occurrences above each threshold, by threshold name."),
        d("ppa_vcpu_identity_error_seconds", Gauge, "Signed error of the accounting identity: wall - (used + steal + halted + idle + limited + paused + blocked)."),
        d("ppa_vcpu_overloads_total", Counter, "Runaway and overload detections of the vCPU."),
        d("ppa_vcpu_exit_handling_duration_seconds", Histogram, "Userspace handling time of one exit, every reason (parks excluded)."),
        d("ppa_vcpu_guest_run_duration_seconds", Histogram, "Wall time of one KVM_RUN (timed accounting levels)."),
        d("ppa_vcpu_wakeup_latency_seconds", Histogram, "From the release of a parked vCPU until it is back in KVM_RUN."),
        d("ppa_group_quota_seconds", Gauge, "CPU time a limit allows per period (group vm: the VM-wide limit); 0 when removed."),
        d("ppa_group_period_seconds", Gauge, "Period of the limit."),
        d("ppa_group_periods_total", Counter, "Periods completed since the limit was set."),
        d("ppa_group_throttled_periods_total", Counter, "Periods in which the limit stopped a member."),
        d("ppa_group_turn_periods_total", Counter, "Periods in which the members took turns: the quota gave each busy member under 1 ms."),
        d("ppa_group_straddled_periods_total", Counter, "Periods whose end a turn straddled: its members were released late in it and ran on into the next."),
        d("ppa_group_used_seconds_total", Counter, "CPU time charged to the members in completed periods: their threads' CPU less their stops' cost (an estimate to the extent of the stops' estimated KVM round trips)."),
        d("ppa_group_stop_cost_seconds_total", Counter, "What stopping and restarting the members cost in completed periods, outside the quota (the VMM's): part cpu (their threads' CPU from each stop to the next guest entry, measured) and kvm_estimate (the KVM round trips the stops forced, an estimate from the measured exit cost)."),
        d("ppa_group_stop_cost_stops_total", Counter, "Stops (limited parks and kick-timer firings) whose cost ppa_group_stop_cost_seconds_total counts."),
        d("ppa_group_limited_seconds_total", Counter, "Time the members spent stopped by the limit (their limited time, summed; cgroup backend: the cgroup's throttled time)."),
        d("ppa_group_overshoot_max_seconds", Gauge, "Largest overshoot of a period (used - quota)."),
        d("ppa_group_overshoot_seconds", Histogram, "Overshoot of one period (used - quota), for the periods that overshot."),
        d("ppa_group_stops_total", Counter, "Stops of the limit's members since it was set, by who stopped them: the members' own kick timers, or the limiter thread's kick (every stop without timers, else the fallback when a timer was late)."),
        d("ppa_group_timer_rearms_total", Counter, "Kick-timer firings after which a member had CPU left (it had been preempted or idle) and re-armed its timer instead of stopping."),
        d("ppa_group_stop_stage_seconds", Histogram, "Wall time of each stage of the members' timer stops since the limit was set (stage: to_handler, to_decision, spin (CPU time, not wall), to_park; docs/limits.md); VMM backend only."),
        d("ppa_device_status", Gauge, "1 for the device's status (ok, needs_reset, failed), 0 for the others."),
        d("ppa_device_cpu_seconds_total", Counter, "CPU time of a device thread (its thread CPU clock); queue is its queue pair."),
        d("ppa_device_thread_seconds_total", Counter, "Where a device thread's wall time went: used, steal (runnable, waiting for a CPU), waiting (asleep in its event loop), blocked (asleep elsewhere)."),
        d("ppa_device_work_cpu_seconds_total", Counter, "A device's CPU by kind of work: tx, rx, ctrl (its control queue), req (a disk's requests), poll (a disk's polling of an empty ring), other (its event loops)."),
        d("ppa_device_notifications_total", Counter, "Guest kicks of a virtqueue."),
        d("ppa_device_interrupts_total", Counter, "Used-buffer interrupts raised for a virtqueue."),
        d("ppa_device_interrupts_suppressed_total", Counter, "Interrupts not raised because the driver did not want them (EVENT_IDX or its flags)."),
        d("ppa_device_chains_total", Counter, "Descriptor chains taken from a virtqueue."),
        d("ppa_device_packets_total", Counter, "Frames a virtqueue carried (to the tap for tx, to the guest for rx)."),
        d("ppa_device_bytes_total", Counter, "Bytes of those frames, virtio header excluded."),
        d("ppa_device_drops_total", Counter, "Frames dropped, by reason."),
        d("ppa_device_throttles_total", Counter, "Times a virtqueue stopped because its device's rate limiter had too few tokens for the next frame or request."),
        d("ppa_device_throttled_seconds_total", Counter, "Time a virtqueue waited for its rate limiter's tokens, a wait in progress included."),
        d("ppa_device_requests_total", Counter, "A disk's requests answered, by type (read, write, flush, get_id, discard, write_zeroes, unknown)."),
        d("ppa_device_requests_merged_total", Counter, "A disk's reads and writes whose data went to the file in one call with the request before them."),
        d("ppa_device_request_bytes_total", Counter, "A disk's data moved, by direction: read (into the guest), written (from it)."),
        d("ppa_device_request_errors_total", Counter, "A disk's requests answered with a status other than OK, by status (ioerr, unsupp)."),
        d("ppa_device_request_service_seconds", Histogram, "A disk request's service time, from its chain taken to its answer given back, by type."),
        d("process_cpu_seconds_total", Counter, "User and system CPU time of the VMM process, every thread (vCPU threads and threads that ended included)."),
        d("process_resident_memory_bytes", Gauge, "Resident memory of the VMM process (guest memory it touched included)."),
        d("process_virtual_memory_bytes", Gauge, "Virtual memory of the VMM process (guest memory included)."),
        d("process_open_fds", Gauge, "Open file descriptors of the VMM process."),
        d("process_max_fds", Gauge, "Limit on open file descriptors (RLIMIT_NOFILE, soft)."),
        d("process_start_time_seconds", Gauge, "Start time of the VMM process since the Unix epoch."),
        d("process_threads", Gauge, "Threads of the VMM process."),
        d("ppa_group_pressure_some_seconds_total", Counter, "Time at least one non-idle member vCPU was stalled, by vCPU group."),
        d("ppa_group_pressure_full_seconds_total", Counter, "Time every non-idle member vCPU was stalled, by vCPU group."),
        d("ppa_group_pressure_estimated", Gauge, "1 when part of the group's pressure figures is an ESTIMATE (the overlap rule), 0 when measured from the members' state intervals."),
        d("ppa_vmm_thread_cpu_seconds_total", Counter, "CPU time of the VMM's threads by kind (main, vcpu, api, sampler, limiter, device, other), threads that ended included."),
        d("ppa_guest_cpu_seconds_total", Counter, "What the guest published in the PPA page: each guest CPU's time by mode (user, system, idle, iowait, irq, softirq, steal), as the guest's /proc/stat counts it; CPUs up to the VM's vCPUs."),
        d("ppa_guest_thread_cpu_seconds_total", Counter, "What the guest published: on-CPU time of the guest's busiest threads (--guest-metrics-threads of them, by tid and name), the others summed under tid=rest (that series can go down when a thread moves into the named ones)."),
        d("ppa_guest_thread_delay_seconds_total", Counter, "What the guest published: the same threads' delays by kind (run: run-queue wait; blkio, swapin, freepages, irq, thrashing, compact, wpcopy: the guest kernel's delay accounting, 0 where it is off)."),
        d("ppa_guest_thread_delays_total", Counter, "What the guest published: how many delays of each kind (run: timeslices)."),
        d("ppa_guest_threads", Gauge, "Threads of the guest: live (alive at the agent's last sample) and exited (still listed with their final figures)."),
        d("ppa_guest_transient_tasks_total", Counter, "What the guest published: tasks that exited and are no longer listed (PPA requirement 22)."),
        d("ppa_guest_transient_cpu_seconds_total", Counter, "What the guest published: their CPU time."),
        d("ppa_guest_agent_cpu_seconds_total", Counter, "CPU time of the guest agent itself, in the guest."),
        d("ppa_guest_alarms_total", Counter, "Alarms of the guest agent (thresholds inside the guest) the VMM forwarded, by what: run_delay, slice, nivcsw, irq, softirq."),
        d("ppa_guest_alarms_lost_total", Counter, "Guest alarms overwritten in the agent's ring before the VMM read them."),
        d("ppa_guest_alarms_refused_total", Counter, "Guest alarm records the VMM refused (an unknown kind) or read torn."),
        d("ppa_guest_alarms_suppressed_total", Counter, "Threshold occurrences the guest agent counted but wrote no alarm for (its cap per sample)."),
        d("ppa_guest_reset_generation", Gauge, "Guest resets: the latest the host asked for (side=requested) and the latest the guest agent carried out (side=honoured)."),
    ]
};

/// Renders `stats` in the Prometheus text exposition format 0.0.4 (serve it with
/// [`CONTENT_TYPE`]). Each family appears once, with `# HELP` and `# TYPE`; families without
/// a sample are left out.
pub fn render(stats: &Detailed) -> String {
    let mut f = Families::new(FAMILIES);
    let vm = stats.vm.name.as_str();
    families::add_vm(&mut f, stats);
    for v in &stats.vcpus {
        families::add_vcpu(&mut f, vm, v);
    }
    for g in &stats.groups {
        families::add_group(&mut f, vm, g);
    }
    devices::add_host_cpu(&mut f, vm, &stats.vm.host_cpu_ns);
    for d in &stats.devices {
        devices::add_device(&mut f, vm, d);
    }
    for g in &stats.pressure_groups {
        families::add_group_pressure(&mut f, vm, g);
    }
    if let Some(p) = &stats.process {
        families::add_process(&mut f, vm, p);
    }
    if let Some(g) = &stats.guest {
        guest::add_guest(&mut f, vm, g);
    }
    f.render()
}

#[cfg(test)]
mod buckets_tests;
#[cfg(test)]
mod devices_tests;
#[cfg(test)]
mod exporter_tests;
#[cfg(test)]
mod guest_tests;
#[cfg(test)]
mod tests;
