//! `ppa-vmm bench limit` (spec section 9): how precisely each backend holds a busy vCPU to
//! 25 % of one CPU, period by period, on a host that may be noisy.
//!
//! Three measurements: one busy vCPU at 100 ms periods (the spec's keys), the same at 10 ms,
//! and, outside the verdict, a group of two busy vCPUs at 50 % (100 ms), where CFS hands out
//! runtime per CPU in slices. Each runs in interleaved rounds (default 5): a round runs every
//! measurement once with the VMM's own enforcement, whose limiter logs the CPU time of every
//! period it closes, and once with the cgroup backend, whose periods are the kernel's: a bench
//! thread polls the cgroup's `cpu.stat` in a loop (a few µs a read, on the core the limited
//! vCPU leaves free) and reads the vCPU threads' CPU clocks whenever `nr_periods` moves, which
//! splits the CPU time at the kernel's period boundaries to within one poll. The error of a
//! period is its CPU time minus the quota; the first two and the last period of each run are
//! left out (start and end are partial).
//!
//! A burst caused by the host below (this machine is itself a guest) is told apart from one
//! caused by us by what each round reports beside its figures: the host's steal over the round
//! (/proc/stat) and the load average, and, for the VMM, the lateness of the limiter's planned
//! looks and of the kick timers' firings (planned time vs the time the thread acted). Each
//! backend's figures are those of its median round (by p99 overshoot): one bad round does not
//! decide, and the verdict uses the median. `--hogs` runs the whole bench beside one spinning
//! process per CPU.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use ppa_vmm_api::LimitBackend;

use super::hogs::Hogs;
use ppa_vmm::accounting::histogram::HistogramSnapshot;
use ppa_vmm::accounting::host::host_steal_ns;
use ppa_vmm::config::RunOptions;
use ppa_vmm::handle::VmHandle;
use ppa_vmm::sync::now_ns;
use ppa_vmm::vm::{Vm, VmError};

mod text;

/// Firings of the signal floor's timer after each VMM run (`StageFigures::signal_floor`).
const SIGNAL_SAMPLES: usize = 100;

/// Options of `bench limit`.
#[derive(Debug, Clone)]
pub struct LimitOptions {
    /// Periods per run.
    pub periods: u64,
    /// Share of one CPU, percent.
    pub percent: u64,
    /// Rounds (each runs every measurement with each backend).
    pub rounds: usize,
    /// Run beside one spinning process per CPU.
    pub hogs: bool,
    /// The cgroup backend is taken as unavailable for this reason without trying it (a test's
    /// simulation of a host without cgroup threaded mode); None: it is tried, and the first
    /// run it cannot set up says why.
    pub cgroup_unavailable: Option<String>,
}

/// The cgroup backend's figures in the result, or why there are none (`{"unavailable":
/// REASON}`: it could not be set up on this host, and the VMM backend ran alone).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum CgroupFigures {
    /// Its median round.
    Measured(ErrorStats),
    /// Why it did not run.
    Unavailable {
        /// The sentence of the error that stopped it.
        unavailable: String,
    },
}

/// Per-period error figures of one backend in one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ErrorStats {
    /// Periods measured.
    pub periods: usize,
    /// Mean of used − quota.
    pub mean_err_ns: f64,
    /// Root mean square of used − quota.
    pub rms_err_ns: f64,
    /// 99th percentile of |used − quota|.
    pub p99_abs_err_ns: u64,
    /// 99th percentile of the overshoot (used − quota when positive, else 0).
    pub p99_overshoot_ns: u64,
    /// Largest used − quota.
    pub max_overshoot_ns: i64,
}

/// Percentiles of a lateness (planned time to the time it happened).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Lateness {
    /// Events.
    pub count: u64,
    /// Median.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// Largest.
    pub max_ns: u64,
}

impl Lateness {
    fn of(h: &HistogramSnapshot) -> Lateness {
        Lateness {
            count: h.count(),
            p50_ns: h.quantile(0.5),
            p99_ns: h.quantile(0.99),
            max_ns: h.max,
        }
    }
}

/// How the VMM backend stopped its members.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KickFigures {
    /// Lateness of the limiter thread's planned looks.
    pub looks: Lateness,
    /// Lateness of the kick timers' firings: from the time a timer was armed for to the time
    /// its vCPU, out of the guest, read the clock (time the thread waited for a CPU
    /// included).
    pub timer: Lateness,
    /// At each timer stop, the CPU the vCPU had used past its target: the part of a timer's
    /// lateness that the vCPU spent running, which becomes overshoot.
    pub timer_overrun: Lateness,
    /// Stops by a kick timer.
    pub timer_kicks: u64,
    /// Timer firings after which the vCPU had CPU left and re-armed.
    pub rearms: u64,
    /// Stops by the limiter thread's kick (the fallback).
    pub limiter_kicks: u64,
    /// The stages of the timer stops, wall time each (docs/limits.md).
    pub stages: StageFigures,
}

/// Where a timer stop's time goes, per stop (docs/limits.md, "Where the overshoot comes
/// from").
#[derive(Debug, Clone, Default, Serialize)]
pub struct StageFigures {
    /// From the time the timer was armed for to its signal handler on the vCPU thread: the
    /// hrtimer's expiry, the signal, the way out of the guest and out of KVM_RUN.
    pub to_handler: Lateness,
    /// From the handler to the run loop's stop decision (sigreturn, the exit's bookkeeping,
    /// the CPU clock read).
    pub to_decision: Lateness,
    /// The CPU time (not wall) of the vCPU's spin from the decision to its CPU target when its
    /// timer fired before it (the timer's lead less its latency; VMM time the exact stop
    /// costs).
    pub spin: Lateness,
    /// Mean of `spin`, ns: the vCPU's CPU each stop spends to stop on its target.
    pub spin_mean_ns: u64,
    /// From the end of the spin to the park (its clock readings).
    pub to_park: Lateness,
    /// The same kind of timer and signal aimed at a thread spinning in user space, measured
    /// between the runs: the hrtimer's expiry and the signal's delivery without KVM. What
    /// `to_handler` adds to it is the way out of the guest and KVM_RUN.
    pub signal_floor: Lateness,
}

/// One round of one measurement: each backend once, back to back.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    /// Round number, from 0.
    pub round: usize,
    /// Period length.
    pub period_ns: u64,
    /// Busy vCPUs in the limit.
    pub members: usize,
    /// The VMM's enforcement.
    pub vmm: ErrorStats,
    /// The same periods of the VMM's run had each overshoot been carried as debt into the
    /// next period, as CFS does (computed from the errors: a candidate, issue 29).
    pub vmm_debt: ErrorStats,
    /// CFS bandwidth control.
    pub cgroup: ErrorStats,
    /// The VMM's stops.
    pub kicks: KickFigures,
    /// The host's steal over the round (both runs), summed over its CPUs.
    pub host_steal_ns: u64,
    /// That steal as a share of the CPU time the host's CPUs had, percent.
    pub host_steal_pct: f64,
    /// One-minute load average when the round started.
    pub load_avg: f64,
}

/// One measurement over all rounds: each backend's median round.
#[derive(Debug, Clone, Serialize)]
pub struct LimitRun {
    /// Period length.
    pub period_ns: u64,
    /// Periods per run.
    pub periods: u64,
    /// The VMM's median round (by p99 overshoot).
    pub vmm: ErrorStats,
    /// The median round of the VMM's periods with overshoot carried as debt (a candidate).
    pub vmm_debt: ErrorStats,
    /// The cgroup backend's median round.
    pub cgroup: ErrorStats,
    /// cgroup RMS over VMM RMS, of the median rounds.
    pub rms_ratio: f64,
    /// cgroup p99 |error| over VMM p99 |error|, of the median rounds.
    pub p99_ratio: f64,
    /// The VMM's stops over all rounds.
    pub kicks: KickFigures,
    /// Which round is each backend's median.
    pub median_round: MedianRound,
}

/// Which round is each backend's median.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MedianRound {
    /// The VMM's.
    pub vmm: usize,
    /// The cgroup backend's.
    pub cgroup: usize,
}

/// The host over the whole bench.
#[derive(Debug, Clone, Serialize)]
pub struct HostFigures {
    /// CPUs online.
    pub cpus: usize,
    /// Spinning processes started beside the bench (`--hogs`).
    pub hogs: usize,
    /// The host's steal over the bench, summed over its CPUs.
    pub steal_ns: u64,
    /// That steal as a share of the CPU time the host's CPUs had, percent.
    pub steal_pct: f64,
    /// One-minute load average at the start.
    pub load_avg_start: f64,
    /// One-minute load average at the end.
    pub load_avg_end: f64,
}

/// Result of `bench limit`: the spec's keys for 100 ms periods (median rounds), the 10 ms
/// measurement and the group beside them, every round, the host, `verdict` last.
#[derive(Debug, Clone, Serialize)]
pub struct LimitResult {
    /// Period length of the main measurement.
    pub period_ns: u64,
    /// Periods per run.
    pub periods: u64,
    /// VMM backend at 100 ms, its median round.
    pub vmm: ErrorStats,
    /// The VMM's periods at 100 ms with overshoot carried as debt, its median round.
    pub vmm_debt: ErrorStats,
    /// cgroup backend at 100 ms, its median round, or why it could not run.
    pub cgroup: CgroupFigures,
    /// cgroup RMS over VMM RMS at 100 ms (median rounds).
    pub rms_ratio: f64,
    /// cgroup p99 |error| over VMM p99 |error| at 100 ms (median rounds).
    pub p99_ratio: f64,
    /// The VMM's stops at 100 ms, over all rounds.
    pub kicks: KickFigures,
    /// Which round is each backend's median at 100 ms.
    pub median_round: MedianRound,
    /// The same measurement at 10 ms periods.
    pub at_10ms: LimitRun,
    /// Not in the spec, for context: two busy vCPUs in a group limited to 25 % each (50 %
    /// of one CPU), 100 ms periods. Not part of the verdict.
    pub group_of_2: LimitRun,
    /// Every round of every measurement, in the order run.
    pub rounds: Vec<Round>,
    /// The host over the bench.
    pub host: HostFigures,
    /// `pass`, or `fail: ...`.
    pub verdict: String,
}

/// Figures of per-period errors (`errors` in ns).
pub fn error_stats(errors: &[i64]) -> ErrorStats {
    if errors.is_empty() {
        return ErrorStats::default();
    }
    let n = errors.len() as f64;
    let mean = errors.iter().map(|&e| e as f64).sum::<f64>() / n;
    let rms = (errors.iter().map(|&e| (e as f64).powi(2)).sum::<f64>() / n).sqrt();
    let pct = |mut v: Vec<u64>| {
        v.sort_unstable();
        v[((v.len() - 1) as f64 * 0.99).round() as usize]
    };
    ErrorStats {
        periods: errors.len(),
        mean_err_ns: mean,
        rms_err_ns: rms,
        p99_abs_err_ns: pct(errors.iter().map(|e| e.unsigned_abs()).collect()),
        p99_overshoot_ns: pct(errors.iter().map(|&e| e.max(0) as u64).collect()),
        max_overshoot_ns: errors.iter().copied().max().unwrap_or(0),
    }
}

/// The errors of periods had each overshoot been carried as debt into the next period (its
/// quota less the overshoot, as CFS bandwidth control does): a stop comes as early in the
/// period's budget with or without the debt, so each period's error less the debt carried
/// in, `e'_k = e_k − max(e'_{k−1}, 0)`.
pub fn with_debt(errors: &[i64]) -> Vec<i64> {
    let mut debt = 0i64;
    errors
        .iter()
        .map(|&e| {
            let d = e - debt;
            debt = d.max(0);
            d
        })
        .collect()
}

/// The median of `runs` by p99 overshoot (then RMS): its index. The lower median when even.
pub fn median_index(runs: &[&ErrorStats]) -> usize {
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by(|&a, &b| {
        let key = |i: usize| (runs[i].p99_overshoot_ns, runs[i].rms_err_ns);
        key(a)
            .partial_cmp(&key(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    order
        .get(runs.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0)
}

/// The limit under test: the VM's (one vCPU) or a group `g` of `members` vCPUs.
fn limit_name(members: usize) -> &'static str {
    if members == 1 {
        "vm"
    } else {
        "g"
    }
}

fn vm(
    o: &LimitOptions,
    period_ns: u64,
    backend: LimitBackend,
    members: usize,
) -> Result<Vm, VmError> {
    let quota_ns = period_ns * o.percent / 100 * members as u64;
    let run_ms = (o.periods + 3) * period_ns / 1_000_000;
    let limit = format!("{}us/{}us", quota_ns / 1000, period_ns / 1000);
    let opts = RunOptions {
        vcpus: Some(members),
        workload: vec![format!("busy:ms={run_ms}")],
        cpu_limit: (members == 1).then(|| limit.clone()),
        vcpu_group: if members == 1 {
            Vec::new()
        } else {
            vec![format!("g:0-{}:{limit}", members - 1)]
        },
        limit_backend: Some(backend),
        report: None,
        ..Default::default()
    };
    let (config, _) = opts.into_config()?;
    Vm::try_from(config)
}

fn trim(used: &[u64], quota_ns: u64) -> Vec<i64> {
    let n = used.len();
    if n < 4 {
        return Vec::new();
    }
    used[2..n - 1]
        .iter()
        .map(|&u| u as i64 - quota_ns as i64)
        .collect()
}

/// Splits the vCPUs' CPU time at the cgroup's period boundaries while the VM runs.
fn poll_cgroup(h: &VmHandle, name: &str, stop: &AtomicBool) -> Vec<u64> {
    let mut used = Vec::new();
    let mut last: Option<(u64, u64)> = None;
    while !stop.load(Ordering::Acquire) {
        let periods = h
            .limiter()
            .cgroup()
            .and_then(|c| c.cpu_stat(name))
            .map(|s| s.nr_periods);
        let cpu = h
            .vcpus()
            .iter()
            .map(|v| v.acct.thread_cpu_ns())
            .sum::<Option<u64>>();
        if let (Some(p), Some(c)) = (periods, cpu) {
            match last {
                Some((lp, lc)) if p != lp => {
                    used.push(c.saturating_sub(lc));
                    last = Some((p, c));
                }
                None => last = Some((p, c)),
                _ => {}
            }
        }
        std::hint::spin_loop();
    }
    used
}

/// What one VMM run leaves for the figures: its errors and its stops, raw.
struct VmmRun {
    stats: ErrorStats,
    debt: ErrorStats,
    looks: HistogramSnapshot,
    stages: [HistogramSnapshot; 5],
    timer: HistogramSnapshot,
    overrun: HistogramSnapshot,
    counts: [u64; 3],
}

fn run_vmm(o: &LimitOptions, period_ns: u64, members: usize) -> Result<VmmRun, VmError> {
    let quota_ns = period_ns * o.percent / 100 * members as u64;
    let name = limit_name(members);
    let v = vm(o, period_ns, LimitBackend::Vmm, members)?;
    let h = v.handle();
    h.limiter().keep_period_log();
    v.run()?;
    let mut timer = HistogramSnapshot::empty(3);
    let mut overrun = HistogramSnapshot::empty(3);
    let mut stages: [HistogramSnapshot; 5] = std::array::from_fn(|_| HistogramSnapshot::empty(3));
    for vc in h.vcpus() {
        timer.merge(&vc.kick_timer.lateness());
        overrun.merge(&vc.kick_timer.overrun());
        let s = vc.kick_timer.stages();
        stages[0].merge(&s.to_handler);
        stages[1].merge(&s.to_decision);
        stages[2].merge(&s.to_park);
        stages[4].merge(&s.spin);
    }
    // The kernel's part alone, on the host as it is now (after the run, before the next).
    if let Ok(floor) = ppa_vmm::probes::kick_signal_path(SIGNAL_SAMPLES) {
        stages[3].merge(&floor);
    }
    let counts = h
        .limiter()
        .groups()
        .iter()
        .find(|g| g.name == name)
        .map_or([0; 3], |g| [g.kicks.timer, g.kicks.rearms, g.kicks.limiter]);
    let errors = trim(&h.limiter().period_log(name), quota_ns);
    Ok(VmmRun {
        stats: error_stats(&errors),
        debt: error_stats(&with_debt(&errors)),
        looks: h.limiter().look_lateness(),
        stages,
        timer,
        overrun,
        counts,
    })
}

fn run_cgroup(o: &LimitOptions, period_ns: u64, members: usize) -> Result<ErrorStats, VmError> {
    let quota_ns = period_ns * o.percent / 100 * members as u64;
    let name = limit_name(members);
    let v = vm(o, period_ns, LimitBackend::Cgroup, members)?;
    let h = v.handle();
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (h, stop) = (h.clone(), Arc::clone(&stop));
        std::thread::spawn(move || poll_cgroup(&h, name, &stop))
    };
    let out = v.run();
    stop.store(true, Ordering::Release);
    let used = poller.join().unwrap_or_default();
    out?;
    Ok(error_stats(&trim(&used, quota_ns)))
}

/// The one-minute load average (0 if /proc/loadavg cannot be read).
pub(super) fn load_avg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// The host's steal between two readings, and as a share of the CPUs' time over `wall_ns`.
pub(super) fn steal_between(before: Option<u64>, after: Option<u64>, wall_ns: u64) -> (u64, f64) {
    let steal = after.unwrap_or(0).saturating_sub(before.unwrap_or(0));
    let pct = steal as f64 * 100.0 / (wall_ns.max(1) as f64 * online_cpus() as f64);
    (steal, pct)
}

/// The measurements: (period, members).
const MEASUREMENTS: [(u64, usize); 3] = [(100_000_000, 1), (10_000_000, 1), (100_000_000, 2)];

/// Runs one round of one measurement.
fn round(
    o: &LimitOptions,
    k: usize,
    (period_ns, members): (u64, usize),
    unavailable: &mut Option<String>,
) -> Result<(Round, VmmRun), VmError> {
    let load = load_avg();
    let (t0, s0) = (now_ns(), host_steal_ns());
    let vmm = run_vmm(o, period_ns, members)?;
    std::thread::sleep(Duration::from_millis(200));
    let cgroup = if unavailable.is_some() {
        ErrorStats::default()
    } else {
        match run_cgroup(o, period_ns, members) {
            Ok(c) => c,
            // Where the cgroup backend cannot be set up (no threaded mode, no cpu controller,
            // no permission), the VMM backend goes on alone and the result says why.
            Err(VmError::Cgroup(e)) => {
                *unavailable = Some(e.to_string());
                ErrorStats::default()
            }
            Err(e) => return Err(e),
        }
    };
    let (steal, pct) = steal_between(s0, host_steal_ns(), now_ns() - t0);
    std::thread::sleep(Duration::from_millis(200));
    let r = Round {
        round: k,
        period_ns,
        members,
        vmm: vmm.stats.clone(),
        vmm_debt: vmm.debt.clone(),
        cgroup,
        kicks: kick_figures(std::slice::from_ref(&vmm)),
        host_steal_ns: steal,
        host_steal_pct: pct,
        load_avg: load,
    };
    Ok((r, vmm))
}

fn kick_figures(runs: &[VmmRun]) -> KickFigures {
    let mut looks = HistogramSnapshot::empty(3);
    let mut timer = HistogramSnapshot::empty(3);
    let mut overrun = HistogramSnapshot::empty(3);
    let mut counts = [0u64; 3];
    let mut stages: [HistogramSnapshot; 5] = std::array::from_fn(|_| HistogramSnapshot::empty(3));
    for r in runs {
        for (s, r) in stages.iter_mut().zip(&r.stages) {
            s.merge(r);
        }
        looks.merge(&r.looks);
        timer.merge(&r.timer);
        overrun.merge(&r.overrun);
        for (c, n) in counts.iter_mut().zip(r.counts) {
            *c += n;
        }
    }
    KickFigures {
        looks: Lateness::of(&looks),
        timer: Lateness::of(&timer),
        timer_overrun: Lateness::of(&overrun),
        timer_kicks: counts[0],
        rearms: counts[1],
        limiter_kicks: counts[2],
        stages: StageFigures {
            to_handler: Lateness::of(&stages[0]),
            to_decision: Lateness::of(&stages[1]),
            spin: Lateness::of(&stages[4]),
            spin_mean_ns: stages[4].sum().checked_div(stages[4].count()).unwrap_or(0),
            to_park: Lateness::of(&stages[2]),
            signal_floor: Lateness::of(&stages[3]),
        },
    }
}

fn summarize(o: &LimitOptions, period_ns: u64, rounds: &[Round], runs: &[VmmRun]) -> LimitRun {
    let vi = median_index(&rounds.iter().map(|r| &r.vmm).collect::<Vec<_>>());
    let di = median_index(&rounds.iter().map(|r| &r.vmm_debt).collect::<Vec<_>>());
    let ci = median_index(&rounds.iter().map(|r| &r.cgroup).collect::<Vec<_>>());
    let (vmm, cgroup) = (rounds[vi].vmm.clone(), rounds[ci].cgroup.clone());
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
    LimitRun {
        period_ns,
        periods: o.periods,
        rms_ratio: ratio(cgroup.rms_err_ns, vmm.rms_err_ns),
        p99_ratio: ratio(cgroup.p99_abs_err_ns as f64, vmm.p99_abs_err_ns as f64),
        vmm,
        vmm_debt: rounds[di].vmm_debt.clone(),
        cgroup,
        kicks: kick_figures(runs),
        median_round: MedianRound {
            vmm: rounds[vi].round,
            cgroup: rounds[ci].round,
        },
    }
}

/// The verdict (issue 16, tightened by issue 29's exact stop): in the median rounds, at
/// 100 ms and at 10 ms, the VMM's p99 overshoot is at most 40 µs or no worse than the cgroup
/// backend's; beside host hogs, at most 200 µs.
fn verdict(runs: [&LimitRun; 2], hogs: bool, cgroup: bool) -> String {
    let bound = if hogs { 200_000 } else { 40_000 };
    let mut fails = Vec::new();
    for r in runs {
        let ms = r.period_ns / 1_000_000;
        let (v, c) = (r.vmm.p99_overshoot_ns, r.cgroup.p99_overshoot_ns);
        if v > bound && (hogs || !cgroup || v > c) {
            let than_cgroup = if hogs || !cgroup {
                String::new()
            } else {
                format!(" and above the cgroup backend's {:.1} us", c as f64 / 1e3)
            };
            fails.push(format!(
                "{ms} ms: VMM p99 overshoot {:.1} us > {} us{than_cgroup}",
                v as f64 / 1e3,
                bound / 1000
            ));
        }
        if r.vmm.periods == 0 || (cgroup && r.cgroup.periods == 0) {
            fails.push(format!("{ms} ms: a backend measured no period"));
        }
    }
    if fails.is_empty() {
        "pass".into()
    } else {
        format!("fail: {}", fails.join("; "))
    }
}

/// Runs `bench limit`.
pub fn limit(o: LimitOptions) -> Result<LimitResult, VmError> {
    let hogs = if o.hogs {
        Some(Hogs::start().map_err(|e| VmError::Thread("host hog", e))?)
    } else {
        None
    };
    let load_avg_start = load_avg();
    let (t0, s0) = (now_ns(), host_steal_ns());
    let mut rounds: Vec<Round> = Vec::new();
    let mut runs: [Vec<VmmRun>; 3] = Default::default();
    let mut unavailable = o.cgroup_unavailable.clone();
    for k in 0..o.rounds.max(1) {
        for (m, &measurement) in MEASUREMENTS.iter().enumerate() {
            let (r, run) = round(&o, k, measurement, &mut unavailable)?;
            rounds.push(r);
            runs[m].push(run);
        }
    }
    let (steal_ns, steal_pct) = steal_between(s0, host_steal_ns(), now_ns() - t0);
    let host = HostFigures {
        cpus: online_cpus(),
        hogs: hogs.as_ref().map_or(0, Hogs::count),
        steal_ns,
        steal_pct,
        load_avg_start,
        load_avg_end: load_avg(),
    };
    drop(hogs);
    let of = |m: usize| -> Vec<Round> {
        let (p, n) = MEASUREMENTS[m];
        rounds
            .iter()
            .filter(|r| r.period_ns == p && r.members == n)
            .cloned()
            .collect()
    };
    let [r100, r10, rg] = runs;
    let main = summarize(&o, MEASUREMENTS[0].0, &of(0), &r100);
    let short = summarize(&o, MEASUREMENTS[1].0, &of(1), &r10);
    let group = summarize(&o, MEASUREMENTS[2].0, &of(2), &rg);
    let verdict = verdict([&main, &short], o.hogs, unavailable.is_none());
    Ok(LimitResult {
        period_ns: main.period_ns,
        periods: main.periods,
        vmm: main.vmm,
        vmm_debt: main.vmm_debt,
        cgroup: match unavailable {
            None => CgroupFigures::Measured(main.cgroup),
            Some(unavailable) => CgroupFigures::Unavailable { unavailable },
        },
        rms_ratio: main.rms_ratio,
        p99_ratio: main.p99_ratio,
        kicks: main.kicks,
        median_round: main.median_round,
        at_10ms: short,
        group_of_2: group,
        rounds,
        host,
        verdict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the cgroup backend cannot be set up (simulated: the reason is given, as the
    /// first failed cgroup run would give it), the bench runs the VMM backend alone and
    /// succeeds, with the reason in its JSON and its text.
    #[test]
    fn without_the_cgroup_backend_the_vmm_backend_runs_alone_and_says_why() {
        if !std::path::Path::new("/dev/kvm").exists() {
            eprintln!("skipped: no /dev/kvm");
            return;
        }
        let why = "cannot write cgroup.threads: Operation not supported (simulated)";
        // Ten periods a run: the first two and the last are left out, the rest is enough to
        // find periods under host load.
        let r = limit(LimitOptions {
            periods: 10,
            percent: 25,
            rounds: 1,
            hogs: false,
            cgroup_unavailable: Some(why.into()),
        })
        .expect("the bench succeeds without the cgroup backend");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["cgroup"], serde_json::json!({ "unavailable": why }));
        assert!(r.vmm.periods > 0 && r.at_10ms.vmm.periods > 0, "{json}");
        assert!(r.rounds.iter().all(|x| x.cgroup.periods == 0));
        assert!(!r.verdict.contains("cgroup"), "{}", r.verdict);
        assert!(r.to_text().contains(why));
    }

    #[test]
    fn error_figures() {
        let e = error_stats(&[100, -100, 300, -300]);
        assert_eq!(e.periods, 4);
        assert_eq!(e.mean_err_ns, 0.0);
        assert!((e.rms_err_ns - (50_000f64).sqrt()).abs() < 1e-9);
        assert_eq!(e.p99_abs_err_ns, 300);
        assert_eq!(e.max_overshoot_ns, 300);
        assert_eq!(e.p99_overshoot_ns, 300);
        assert_eq!(error_stats(&[]).periods, 0);
        assert_eq!(trim(&[9, 9, 30, 20, 9], 25), vec![5, -5]);
    }

    #[test]
    fn debt_carries_only_overshoot_into_the_next_period() {
        assert_eq!(
            with_debt(&[10, 0, -5, 20, 20, 0]),
            vec![10, -10, -5, 20, 0, 0]
        );
        assert_eq!(with_debt(&[]), Vec::<i64>::new());
        // A burst is paid back at once, so the periods' sum is the burst's alone.
        let e = with_debt(&[1_000, 3, -2, 3]);
        assert_eq!(e, vec![1_000, -997, -2, 3]);
    }

    fn with_p99(ns: u64) -> ErrorStats {
        ErrorStats {
            p99_overshoot_ns: ns,
            ..Default::default()
        }
    }

    #[test]
    fn the_median_round_is_the_middle_one_by_p99_overshoot() {
        let r: Vec<ErrorStats> = [90, 10, 5_000, 40, 60].into_iter().map(with_p99).collect();
        assert_eq!(
            median_index(&r.iter().collect::<Vec<_>>()),
            4,
            "60 of 5,10,40,60,.."
        );
        let two: Vec<ErrorStats> = [30, 20].into_iter().map(with_p99).collect();
        assert_eq!(
            median_index(&two.iter().collect::<Vec<_>>()),
            1,
            "the lower one"
        );
        assert_eq!(median_index(&[]), 0);
    }

    #[test]
    fn the_verdict_takes_40_us_or_the_cgroup_figure_and_200_us_with_hogs() {
        let run = |vmm: u64, cgroup: u64| LimitRun {
            period_ns: 10_000_000,
            periods: 50,
            vmm: ErrorStats {
                periods: 47,
                ..with_p99(vmm)
            },
            vmm_debt: ErrorStats::default(),
            cgroup: ErrorStats {
                periods: 47,
                ..with_p99(cgroup)
            },
            rms_ratio: 1.0,
            p99_ratio: 1.0,
            kicks: KickFigures::default(),
            median_round: MedianRound { vmm: 0, cgroup: 0 },
        };
        assert_eq!(
            verdict([&run(30_000, 0), &run(40_000, 0)], false, true),
            "pass"
        );
        assert_eq!(
            verdict([&run(150_000, 160_000), &run(1, 0)], false, true),
            "pass"
        );
        assert!(
            verdict([&run(150_000, 140_000), &run(1, 0)], false, true).starts_with("fail: 10 ms")
        );
        assert!(verdict([&run(41_000, 20_000), &run(1, 0)], false, true).starts_with("fail: 10 ms"));
        assert_eq!(verdict([&run(190_000, 0), &run(1, 0)], true, true), "pass");
        assert!(verdict([&run(210_000, 900_000), &run(1, 0)], true, true).starts_with("fail"));
        // Without the cgroup backend (not set up on this host) the VMM's bound alone decides,
        // and its missing periods are no failure.
        let alone = |vmm: u64| LimitRun {
            cgroup: ErrorStats::default(),
            ..run(vmm, 0)
        };
        assert_eq!(
            verdict([&alone(30_000), &alone(40_000)], false, false),
            "pass"
        );
        let v = verdict([&alone(41_000), &alone(1)], false, false);
        assert!(v.starts_with("fail: ") && !v.contains("cgroup"), "{v}");
    }
}
