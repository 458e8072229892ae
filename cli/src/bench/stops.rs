//! `ppa-vmm bench stops` (issue 39): what stopping a limited vCPU costs, and how much of a
//! small quota its guest gets for its own code, by the guest's own rdtsc and by `guest_ns`.
//!
//! A ladder of quotas per busy member (100 µs to 1 ms per 10 ms period) for one and for four
//! busy vCPUs under one VM limit, each run `--rounds` times in an order that rotates, each run
//! measured beside the platform's share (a host thread spinning on the monotonic clock for
//! 300 ms before it, summing its gaps over 2 µs: what a guest's rdtsc loop loses to the
//! machine whatever the VMM does). Per run: the guest's ran_ns, guest_ns, what the limit
//! charged and what the vCPU threads used, each over the quota's share of the wall time; the
//! stops per period and what each cost (its CPU, and the KVM round trip estimated). Quotas
//! under the smallest the VMM accepts are set without its check. The verdict: at the smallest
//! accepted quota and above, the median run's guest rdtsc share is at least 90 % of the quota
//! less the platform's share, and its guest_ns share at least 90 %.

use serde::Serialize;

use ppa_vmm::accounting::host::host_steal_ns;
use ppa_vmm::config::RunOptions;
use ppa_vmm::sync::now_ns;
use ppa_vmm::vm::{Vm, VmError};

/// The period of every run.
const PERIOD_NS: u64 = 10_000_000;
/// Quotas per busy member, µs per period.
const LADDER_US: [u64; 5] = [100, 150, 250, 500, 1_000];
/// Busy vCPUs under the limit.
const VCPUS: [usize; 2] = [1, 4];

/// Options of `bench stops`.
#[derive(Debug, Clone, Copy)]
pub struct StopsOptions {
    /// Rounds.
    pub rounds: usize,
    /// Length of each run (the busy workload), ms.
    pub run_ms: u64,
}

/// One run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StopsRun {
    /// Busy vCPUs.
    pub vcpus: usize,
    /// Quota per member per period, µs.
    pub per_member_us: u64,
    /// Σ the guest's ran_ns (its own rdtsc) over (quota share × wall), percent.
    pub ran_pct: f64,
    /// Σ guest_ns over the same, percent.
    pub guest_ns_pct: f64,
    /// What the limit charged over its periods, over the quota, percent.
    pub charged_pct: f64,
    /// Σ used_ns (the vCPU threads' CPU, stops included) over the quota's share, percent.
    pub used_pct: f64,
    /// Stops (parks and timer firings) per period.
    pub stops_per_period: f64,
    /// Mean CPU of a stop outside KVM_RUN, µs (measured).
    pub stop_cpu_us: f64,
    /// Mean KVM round trip of a stop, µs (estimated).
    pub stop_kvm_est_us: f64,
    /// The platform's share beside the run, percent.
    pub platform_pct: f64,
    /// The host's steal over the run, percent of its CPUs' time.
    pub host_steal_pct: f64,
}

/// One rung over the rounds: its median run by `ran_pct`.
#[derive(Debug, Clone, Serialize)]
pub struct Rung {
    /// The median run.
    pub median: StopsRun,
    /// Every round's `ran_pct`.
    pub ran_pct: Vec<f64>,
    /// Whether the median run holds: ran ≥ 90 % of (100 − platform) and guest_ns ≥ 90 %.
    pub holds: bool,
}

/// Result of `bench stops`; `verdict` last.
#[derive(Debug, Clone, Serialize)]
pub struct StopsResult {
    /// Period of every run, ns.
    pub period_ns: u64,
    /// The smallest quota the VMM accepts, µs (the whole quota: members that share one too
    /// small to give each 1 ms take turns).
    pub min_quota_us: u64,
    /// Every rung.
    pub rungs: Vec<Rung>,
    /// Per vCPU count, the smallest quota per member from which every rung up holds, µs.
    pub smallest_holding_us: Vec<(usize, Option<u64>)>,
    /// One-minute load average at the start and the end.
    pub load_avg: [f64; 2],
    /// The host's steal over the bench, percent.
    pub host_steal_pct: f64,
    /// `pass`, or `fail: ...`.
    pub verdict: String,
}

/// The share of a spinning thread's time lost in gaps over 2 µs, for `ms`.
pub fn platform_share(ms: u64) -> f64 {
    let t0 = now_ns();
    let end = t0 + ms * 1_000_000;
    let (mut last, mut lost) = (t0, 0u64);
    loop {
        let now = now_ns();
        if now - last > 2_000 {
            lost += now - last;
        }
        last = now;
        if now >= end {
            break;
        }
    }
    lost as f64 / (last - t0).max(1) as f64
}

fn run(o: &StopsOptions, vcpus: usize, per_member_us: u64) -> Result<StopsRun, VmError> {
    let platform = platform_share(300);
    let (t0, s0) = (now_ns(), host_steal_ns());
    let opts = RunOptions {
        vcpus: Some(vcpus),
        workload: vec![format!("busy:ms={}", o.run_ms)],
        // A share the guest cannot make progress in must not hold the bench for long.
        max_runtime: Some((o.run_ms * 5) as f64 / 1_000.0),
        ..Default::default()
    };
    let (mut config, _) = opts.into_config()?;
    let quota_ns = per_member_us * 1_000 * vcpus as u64;
    ppa_vmm::probes::set_vm_limit_unchecked(&mut config, quota_ns, PERIOD_NS);
    let out = Vm::try_from(config)?.run()?;
    let steal = super::limit::steal_between(s0, host_steal_ns(), now_ns() - t0).1;
    let r = &out.report;
    let wall = r.vcpus.iter().map(|v| v.times.wall_ns).max().unwrap_or(1) as f64;
    let share = quota_ns as f64 / PERIOD_NS as f64;
    let of_quota = |ns: u64| ns as f64 * 100.0 / (share * wall);
    let sum = |f: fn(&ppa_vmm::report::VcpuReport) -> u64| r.vcpus.iter().map(f).sum::<u64>();
    let ran = sum(|v| {
        v.tiny()
            .and_then(|t| t.guest_reported.get("ran_ns").copied())
            .unwrap_or(0)
    });
    let g = r.groups.first();
    let stops = g.map_or(0, |g| g.stops.count).max(1) as f64;
    Ok(StopsRun {
        vcpus,
        per_member_us,
        ran_pct: of_quota(ran),
        guest_ns_pct: of_quota(sum(|v| v.times.guest_ns)),
        charged_pct: g.and_then(|g| g.used_percent()).unwrap_or(0.0) / share,
        used_pct: of_quota(sum(|v| v.times.used_ns)),
        stops_per_period: g.map_or(0.0, |g| g.stops.count as f64 / g.periods.max(1) as f64),
        stop_cpu_us: g.map_or(0.0, |g| g.stops.cpu_ns as f64 / 1e3 / stops),
        stop_kvm_est_us: g.map_or(0.0, |g| g.stops.kvm_ns_estimate as f64 / 1e3 / stops),
        platform_pct: platform * 100.0,
        host_steal_pct: steal,
    })
}

/// Whether run `r` gives its guest 90 % of its quota: its rdtsc share at least 90 % of what
/// the platform leaves, and its guest_ns share at least 90 %.
pub fn holds(r: &StopsRun) -> bool {
    r.ran_pct >= 0.9 * (100.0 - r.platform_pct) && r.guest_ns_pct >= 90.0
}

/// Per vCPU count, the smallest rung from which every larger one holds.
fn smallest_holding(rungs: &[Rung]) -> Vec<(usize, Option<u64>)> {
    VCPUS
        .iter()
        .map(|&n| {
            let mine: Vec<&Rung> = rungs.iter().filter(|r| r.median.vcpus == n).collect();
            let first_bad_from_top = mine.iter().rposition(|r| !r.holds);
            let from = match first_bad_from_top {
                None => mine.first(),
                Some(i) => mine.get(i + 1),
            };
            (n, from.map(|r| r.median.per_member_us))
        })
        .collect()
}

/// Runs `bench stops`.
pub fn stops(o: StopsOptions) -> Result<StopsResult, VmError> {
    let load_start = super::limit::load_avg();
    let (t0, s0) = (now_ns(), host_steal_ns());
    let configs: Vec<(usize, u64)> = VCPUS
        .iter()
        .flat_map(|&n| LADDER_US.iter().map(move |&q| (n, q)))
        .collect();
    let mut runs: Vec<Vec<StopsRun>> = vec![Vec::new(); configs.len()];
    for round in 0..o.rounds.max(1) {
        for k in 0..configs.len() {
            let i = (round + k) % configs.len();
            let (n, q) = configs[i];
            runs[i].push(run(&o, n, q)?);
        }
    }
    let rungs: Vec<Rung> = runs
        .into_iter()
        .map(|mut rs| {
            rs.sort_by(|a, b| a.ran_pct.total_cmp(&b.ran_pct));
            let median = rs[(rs.len() - 1) / 2].clone();
            Rung {
                holds: holds(&median),
                ran_pct: rs.iter().map(|r| r.ran_pct).collect(),
                median,
            }
        })
        .collect();
    let min_us = ppa_vmm::probes::MIN_QUOTA_NS / 1_000;
    let fails: Vec<String> = rungs
        .iter()
        .filter(|r| r.median.per_member_us * r.median.vcpus as u64 >= min_us && !r.holds)
        .map(|r| {
            format!(
                "{} vCPU(s) at {} us each: guest rdtsc {:.1} %, guest_ns {:.1} % of the quota (platform {:.1} %)",
                r.median.vcpus, r.median.per_member_us, r.median.ran_pct, r.median.guest_ns_pct, r.median.platform_pct
            )
        })
        .collect();
    Ok(StopsResult {
        period_ns: PERIOD_NS,
        min_quota_us: min_us,
        smallest_holding_us: smallest_holding(&rungs),
        rungs,
        load_avg: [load_start, super::limit::load_avg()],
        host_steal_pct: super::limit::steal_between(s0, host_steal_ns(), now_ns() - t0).1,
        verdict: if fails.is_empty() {
            "pass".into()
        } else {
            format!("fail: {}", fails.join("; "))
        },
    })
}

impl StopsResult {
    /// The table.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "busy vCPUs under one VM limit, {} ms periods; each run's figures over the quota's share of wall (median run of each rung by the guest's rdtsc)\n\
             VCPUS  US/MEMBER   RDTSC%  GUEST_NS%  CHARGED%   USED%  STOPS/PERIOD  STOP_CPU_US  STOP_KVM_US(est)  PLATFORM%  HOLDS\n",
            self.period_ns / 1_000_000
        );
        for r in &self.rungs {
            let m = &r.median;
            s.push_str(&format!(
                "{:>5}  {:>9}  {:>7.1}  {:>9.1}  {:>8.1}  {:>6.1}  {:>12.2}  {:>11.1}  {:>16.1}  {:>9.1}  {}\n",
                m.vcpus, m.per_member_us, m.ran_pct, m.guest_ns_pct, m.charged_pct, m.used_pct,
                m.stops_per_period, m.stop_cpu_us, m.stop_kvm_est_us, m.platform_pct,
                if r.holds { "yes" } else { "no" }
            ));
        }
        for (n, us) in &self.smallest_holding_us {
            s.push_str(&format!(
                "{n} vCPU(s): the guest keeps 90 % from {} per member; the VMM accepts quotas from {} us (members take turns below 1 ms each)\n",
                us.map_or("no rung".to_string(), |u| format!("{u} us")),
                self.min_quota_us
            ));
        }
        s.push_str(&format!(
            "RDTSC% holds at 90 % of (100 - PLATFORM%), the share of a spinning host thread's time the machine takes; STOP_KVM_US is an estimate (the measured exit round trip)\nload {:.1} -> {:.1}, host steal {:.3} %\nverdict: {}\n",
            self.load_avg[0], self.load_avg[1], self.host_steal_pct, self.verdict
        ));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rung(vcpus: usize, us: u64, holds: bool) -> Rung {
        Rung {
            median: StopsRun {
                vcpus,
                per_member_us: us,
                ..Default::default()
            },
            ran_pct: Vec::new(),
            holds,
        }
    }

    #[test]
    fn the_smallest_holding_rung_is_the_lowest_from_which_all_above_hold() {
        let r = [
            rung(1, 100, false),
            rung(1, 150, true),
            rung(1, 250, true),
            rung(4, 100, true),
            rung(4, 150, false),
            rung(4, 250, true),
            rung(4, 500, true),
        ];
        assert_eq!(smallest_holding(&r), vec![(1, Some(150)), (4, Some(250))]);
        assert_eq!(
            smallest_holding(&[rung(1, 1_000, false)]),
            vec![(1, None), (4, None)]
        );
    }

    #[test]
    fn a_run_holds_at_90_percent_of_what_the_platform_leaves() {
        let r = StopsRun {
            ran_pct: 86.0,
            guest_ns_pct: 99.0,
            platform_pct: 5.0,
            ..Default::default()
        };
        assert!(holds(&r), "86 >= 0.9 * 95 = 85.5");
        assert!(
            !holds(&r.clone().with_platform(2.0)),
            "86 < 0.9 * 98 = 88.2"
        );
        assert!(!holds(&StopsRun {
            guest_ns_pct: 89.0,
            ..r
        }));
    }

    impl StopsRun {
        fn with_platform(mut self, p: f64) -> Self {
            self.platform_pct = p;
            self
        }
    }
}
