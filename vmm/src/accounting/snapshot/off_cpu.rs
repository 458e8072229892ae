//! How a vCPU's time off its CPU and not runnable, outside parks, splits into `halted_ns` and
//! `blocked_ns` (docs/accounting.md): a pure function of two raw samples and KVM's halt
//! statistics, unit-tested with the snapshot's tests.

use super::super::meter::MicroState;
use super::super::Level;
use super::{KnownStat, RawSample, VcpuStats};

/// What [`off_cpu_split`] works from.
pub(super) struct OffCpuInputs<'a> {
    pub(super) cur: &'a RawSample,
    pub(super) base: &'a RawSample,
    /// Exits counted at each level (off, basic, full) in the window.
    pub(super) levels: [u64; 3],
    pub(super) used: u64,
    pub(super) steal: u64,
    /// KVM's halt_wait_ns growth in the window.
    pub(super) halt_wait: u64,
    /// Whether the guest halts inside KVM_RUN (KVM has counted halt exits).
    pub(super) halts_in_kernel: bool,
}

/// The time the thread was off its CPU and not runnable outside parks, split into halted
/// (the guest's HLT inside KVM_RUN, and an application processor's wait for its start-up
/// IPI) and blocked (everything else: asleep in the kernel). Returns (halted, blocked).
///
/// Outside parks the thread is on a CPU, runnable (run_delay, i.e. steal) or not runnable:
/// not runnable = wall − on-CPU − run_delay, each outside parks. The on-CPU part is the
/// thread CPU clock less the parks' CPU at every level: the clock and run_delay are both the
/// scheduler's, taken at the same points of each context switch, while the records' switch
/// times are perf's, later on the way in by the time perf takes to schedule the thread's
/// events in (measured: 0.5 % of wall for a Linux guest with the tracepoints in the nested
/// host, docs/accounting.md). The records' own on-CPU figure is reported beside it as
/// `records_on_cpu_ns` ([`records_on_cpu`]), a cross-check from an independent source, as
/// `records_preempted_ns` is for steal. Halted + blocked is what remains, so the identity
/// checks the parts measured apart (steal, parks) against the wall. The wake-up wait after a
/// block is in run_delay (steal), as Linux counts it, and is taken out of the block. Of what is left,
/// KVM's halt time (which itself includes the wake-up wait: an upper bound) goes to halted
/// first. At level off nothing is timed: halted is KVM's halt time, blocked 0.
pub(super) fn off_cpu_split(i: OffCpuInputs<'_>) -> (u64, u64) {
    let (m, bm) = (&i.cur.meter, &i.base.meter);
    let start_wait = m.start_wait.saturating_sub(bm.start_wait);
    let mut halt_cap = i.halt_wait + start_wait;
    if i.halts_in_kernel {
        halt_cap += i.cur.blocking_ns;
    }
    if i.levels[Level::Off as usize] != 0 {
        return (halt_cap, 0);
    }
    let d = |a: u64, b: u64| a.saturating_sub(b);
    let nonpark_wall = d(
        m.wall[MicroState::Guest] + m.wall[MicroState::Vmm],
        bm.wall[MicroState::Guest] + bm.wall[MicroState::Vmm],
    );
    let park_cpu = d(m.park_cpu, bm.park_cpu);
    let park_delay = d(m.park_delay, bm.park_delay);
    let on_cpu = d(i.used, park_cpu);
    let not_runnable = d(d(nonpark_wall, on_cpu), d(i.steal, park_delay));
    let halted = not_runnable.min(halt_cap);
    (halted, not_runnable - halted)
}

/// The time on a CPU outside parks as the vCPU thread measured it per interval at level full
/// (each interval's wall time less the records' off-CPU episodes; the thread-CPU-clock delta
/// where split_source is `cpu_clock`), when every interval of the window was measured so
/// (level full throughout, no record lost, the interval in progress seen); None otherwise.
pub(super) fn records_on_cpu(
    cur: &RawSample,
    base: &RawSample,
    levels: [u64; 3],
    records_lost: u64,
) -> Option<u64> {
    let (m, bm) = (&cur.meter, &base.meter);
    let measured = levels[Level::Off as usize] == 0
        && levels[Level::Basic as usize] == 0
        && levels[Level::Full as usize] > 0
        && records_lost == 0
        && cur.on_cpu_complete;
    measured.then(|| {
        (m.cpu_guest_full + m.cpu_vmm_full).saturating_sub(bm.cpu_guest_full + bm.cpu_vmm_full)
    })
}

/// A known scalar KVM statistic of a sample (cumulative since the thread started).
pub(super) fn cur_kvm_stat(kvm: Option<&VcpuStats>, values: &[u64], s: KnownStat) -> Option<u64> {
    kvm.and_then(|k| k.known_index(s))
        .and_then(|i| values.get(i).copied())
}
