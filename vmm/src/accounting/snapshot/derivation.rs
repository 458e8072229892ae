//! The fields of spec section 4 from a raw sample and its baseline ([`derive`]): the time
//! split (used = guest + kvm + interrupted + vmm, then the off-CPU parts), KVM's statistics
//! since the baseline, how the split was measured, the exits and the host CPUs. Pure functions
//! of two [`RawSample`]s, unit-tested with the snapshot's tests.

use std::collections::BTreeMap;

use super::super::meter::{MeterReading, MicroState, ParkKind, PerLevel};
use super::super::{Level, Threshold};
use super::kernel::{self, KernelFigures};
use super::off_cpu::{cur_kvm_stat, off_cpu_split, records_on_cpu, OffCpuInputs};
use super::{sub_arr, sub_vec, HistSnapshots, HostCpu, Kernel, RawSample, VcpuTimes};
use crate::accounting::ExitReason;
use crate::hypervisor::stats::{KnownStat, StatKind, VcpuStats};
use crate::hypervisor::ExitCost;
use ppa_vmm_api::{SplitKind, SplitSource, TimeSplit};

/// A sample and its baseline, with the KVM statistics' layout their scalars follow.
struct Since<'a> {
    cur: &'a RawSample,
    base: &'a RawSample,
    kvm: Option<&'a VcpuStats>,
}

impl Since<'_> {
    /// Scalar `i` since the baseline (a cumulative one; a gauge as it is).
    fn kvm_delta(&self, k: &VcpuStats, i: usize) -> Option<u64> {
        let v = *self.cur.kvm.get(i)?;
        Some(match (k.scalar_kind(i)?, self.base.kvm.get(i)) {
            (StatKind::Cumulative, Some(o)) => v.saturating_sub(*o),
            _ => v,
        })
    }

    /// A known KVM statistic since the baseline, when KVM has it.
    fn kvm_stat(&self, s: KnownStat) -> Option<u64> {
        self.kvm.and_then(|k| self.kvm_delta(k, k.known_index(s)?))
    }

    /// Every KVM statistic since the baseline, by name (only with `detail`).
    fn kvm_stats(&self, detail: bool) -> BTreeMap<String, u64> {
        match self.kvm {
            Some(k) if detail => k
                .scalar_names()
                .enumerate()
                .filter_map(|(i, n)| Some((n.to_string(), self.kvm_delta(k, i)?)))
                .collect(),
            _ => BTreeMap::new(),
        }
    }

    /// The time split of spec section 4: used = guest + kvm + interrupted + vmm, the measured
    /// parts each within what is left, then the off-CPU parts.
    fn time_split(&self, kf: &KernelFigures, irq_time_accounted: bool) -> TimeSplit {
        let (cur, b) = (self.cur, self.base);
        let (m, bm) = (&cur.meter, &b.meter);
        let irq = kf.interrupted_ns.unwrap_or(0);
        let mut used = cur.used_ns.saturating_sub(b.used_ns);
        if irq_time_accounted {
            used += irq;
        }
        let steal = cur.steal_ns.saturating_sub(b.steal_ns);
        let vmm = (m.cpu_vmm_full + m.vmm_wall_basic + m.park_cpu)
            .saturating_sub(bm.cpu_vmm_full + bm.vmm_wall_basic + bm.park_cpu + kf.irq_vmm_ns)
            .min(used);
        // used = guest + kvm + interrupted + vmm: the measured parts, each within what is left.
        let irq = irq.min(used - vmm);
        let kvm_ns = kf.kvm_ns.map_or(0, |k| k.min(used - vmm - irq));
        let guest = used - vmm - irq - kvm_ns;
        let blocked = m.blocked.since(&bm.blocked);
        let levels = m.exits_at_level.since(&bm.exits_at_level);
        let (halted, blocked_ns) = off_cpu_split(OffCpuInputs {
            cur,
            base: b,
            levels: *levels.values(),
            used,
            steal,
            halt_wait: self.kvm_stat(KnownStat::HaltWaitNs).unwrap_or(0),
            halts_in_kernel: cur_kvm_stat(self.kvm, &cur.kvm, KnownStat::HaltExits).unwrap_or(0)
                > 0,
        });
        TimeSplit {
            wall_ns: cur.wall_ns.saturating_sub(b.wall_ns),
            used_ns: used,
            guest_ns: guest,
            kvm_ns,
            interrupted_ns: irq,
            vmm_ns: vmm,
            steal_ns: steal,
            halted_ns: halted,
            idle_ns: blocked[ParkKind::Idle],
            limited_ns: blocked[ParkKind::Limited],
            paused_ns: blocked[ParkKind::Paused],
            blocked_ns,
        }
    }
}

/// How the split was measured: per level the exits counted (`levels`), the KVM_RUN intervals
/// with records and those KVM's tracepoints split.
fn split_kinds(
    levels: &PerLevel<u64>,
    records_runs: u64,
    kvm_runs: u64,
) -> (SplitKind, SplitSource) {
    let source = match (levels[Level::Full], records_runs) {
        (0, _) => SplitSource::None,
        (n, r) if r >= n && kvm_runs >= n => SplitSource::Tracepoints,
        (n, r) if r >= n => SplitSource::Records,
        (_, 0) => SplitSource::CpuClock,
        _ => SplitSource::Mixed,
    };
    let kind = match levels.values() {
        [_, 0, 0] => SplitKind::None,
        [0, 0, _] => SplitKind::Exact,
        [0, _, 0] => SplitKind::Estimated,
        _ => SplitKind::Mixed,
    };
    (kind, source)
}

/// The host CPUs the vCPU ran on (only with `detail`), each with its share of `guest` by the
/// guest-mode wall time it got there.
fn host_cpus(m: &MeterReading, bm: &MeterReading, guest: u64, detail: bool) -> Vec<HostCpu> {
    let run_by_cpu = sub_vec(&m.guest_wall_by_cpu, &bm.guest_wall_by_cpu);
    let entries_by_cpu = sub_vec(&m.entries_by_cpu, &bm.entries_by_cpu);
    let run_total: u64 = run_by_cpu.iter().sum();
    run_by_cpu
        .iter()
        .filter(|_| detail)
        .zip(&entries_by_cpu)
        .enumerate()
        .filter(|(_, (r, e))| **r > 0 || **e > 0)
        .map(|(cpu, (r, e))| HostCpu {
            cpu,
            guest_ns: if run_total == 0 {
                0
            } else {
                (u128::from(guest) * u128::from(*r) / u128::from(run_total)) as u64
            },
            entries: *e,
        })
        .collect()
}

/// KVM's exit-handling estimate: every exit KVM counted (those handled in the kernel
/// included) paid about one measured round trip, the first after a park the cold one of a
/// park as long as these parks were on average (`parked_ns` over `parks`; the cold cost is
/// on a line between the two park lengths measured, so the mean park gives the sum).
fn kvm_ns_estimate(
    kvm_exits: Option<u64>,
    exit_cost: Option<ExitCost>,
    (parks, parked_ns): (u64, u64),
    used: u64,
) -> Option<u64> {
    match (kvm_exits, exit_cost) {
        (Some(exits), Some(c)) => {
            let cold = parks.min(exits);
            let after_park = c.after_park_of(parked_ns / parks.max(1));
            Some(((exits - cold) * c.hot_ns + cold * after_park).min(used))
        }
        _ => None,
    }
}

/// Exit counts (all reasons with `detail`, else those that occurred: the overview drops the
/// others anyway, and each is an allocation) and exit handling times (only with `detail`).
fn exit_maps(
    m: &MeterReading,
    bm: &MeterReading,
    detail: bool,
) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let exits = sub_arr(m.exits, bm.exits);
    let exit_ns = sub_arr(m.exit_ns, bm.exit_ns);
    (
        ExitReason::ALL
            .iter()
            .filter(|r| detail || exits[r.index()] > 0)
            .map(|r| (r.name().to_string(), exits[r.index()]))
            .collect(),
        ExitReason::ALL
            .iter()
            .filter(|_| detail)
            .map(|r| (r.name().to_string(), exit_ns[r.index()]))
            .collect(),
    )
}

/// Derives the section 4 fields from a sample and an optional baseline.
pub fn derive(
    cur: &RawSample,
    base: Option<&RawSample>,
    kvm: Option<&VcpuStats>,
    exit_cost: Option<ExitCost>,
    detail: bool,
    kernel: Kernel<'_>,
) -> (VcpuTimes, HistSnapshots) {
    let zero;
    let b = match base {
        Some(b) => b,
        None => {
            zero = RawSample::zero(cur.hist.clone());
            &zero
        }
    };
    let (m, bm) = (&cur.meter, &b.meter);
    let hist = base.map_or_else(|| cur.hist.clone(), |b| cur.hist.since(&b.hist));
    let since = Since { cur, base: b, kvm };
    let kf = kernel::figures(m, bm, kernel.why);
    let time = since.time_split(&kf, kernel.irq_time_accounted);
    let levels = m.exits_at_level.since(&bm.exits_at_level);
    let (split, split_source) = split_kinds(
        &levels,
        m.records_runs.saturating_sub(bm.records_runs),
        kf.kvm_runs,
    );
    let parks = m.parks.saturating_sub(bm.parks);
    let kvm_ns_estimate = kvm_ns_estimate(
        since.kvm_stat(KnownStat::Exits),
        exit_cost,
        (parks, time.idle_ns + time.limited_ns + time.paused_ns),
        time.used_ns,
    );
    let (exits, exit_ns) = exit_maps(m, bm, detail);
    let exceeded = m.exceeded.since(&bm.exceeded);
    let times = VcpuTimes {
        id: 0,
        host_tid: 0,
        wall_ns: time.wall_ns,
        used_ns: time.used_ns,
        guest_ns: time.guest_ns,
        kvm_ns: kf.kvm_ns.map(|_| time.kvm_ns),
        interrupted_ns: kf.interrupted_ns.map(|_| time.interrupted_ns),
        kvm_ns_estimate,
        guest_code_ns_estimate: kvm_ns_estimate.map(|k| time.guest_ns.saturating_sub(k)),
        parks,
        vmm_ns: time.vmm_ns,
        steal_ns: time.steal_ns,
        halted_ns: time.halted_ns,
        idle_ns: time.idle_ns,
        limited_ns: time.limited_ns,
        paused_ns: time.paused_ns,
        blocked_ns: time.blocked_ns,
        split,
        split_source,
        records_lost: m.records_lost.saturating_sub(bm.records_lost),
        records_preempted_ns: m.records_preempted.saturating_sub(bm.records_preempted),
        records_on_cpu_ns: records_on_cpu(
            cur,
            b,
            *levels.values(),
            m.records_lost.saturating_sub(bm.records_lost),
        ),
        identity_error_ns: time.identity_error_ns(),
        state: m.micro_state().into(),
        exits,
        exit_ns,
        kvm_ns_reason: kf.kvm_ns_reason,
        interrupted_reason: kf.interrupted_reason,
        kvm_exits: kf.kvm_exits,
        kvm_exit_ns: if detail {
            kf.kvm_exit_ns
        } else {
            BTreeMap::new()
        },
        kvm_exits_to_user: kf.kvm_exits_to_user,
        interrupts: kf.interrupts,
        kvm_stats: since.kvm_stats(detail),
        host_cpus: host_cpus(m, bm, time.guest_ns, detail),
        migrations: m.migrations.saturating_sub(bm.migrations),
        thresholds: Threshold::ALL
            .into_iter()
            .filter(|_| detail)
            .map(|t| (t.to_string(), exceeded[t]))
            .collect(),
        kvm_run_wall_ns: m.wall[MicroState::Guest].saturating_sub(bm.wall[MicroState::Guest]),
        kvm_run_cpu_ns: (levels[Level::Full] > 0)
            .then(|| m.cpu_guest_full.saturating_sub(bm.cpu_guest_full)),
        park_cpu_ns: m.park_cpu.saturating_sub(bm.park_cpu),
        proc_ticks: cur.ticks,
        overloads: 0,
        cpus: None,
        last_cpu: None,
        steal_before_start_ns: 0,
        stamp_clock: None,
        stamp_clock_drifts: 0,
    };
    (times, hist)
}
