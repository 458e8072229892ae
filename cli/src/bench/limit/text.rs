//! The text table of `bench limit` ([`LimitResult::to_text`]): every round of every
//! measurement, the median rounds, the ratios, how the VMM stopped its members and the stages
//! of its timer stops, the host.

use ppa_vmm_api::LimitBackend;

use super::{CgroupFigures, ErrorStats, Lateness, LimitResult, LimitRun, MEASUREMENTS};

fn error_row(s: &mut String, label: &str, name: LimitBackend, e: &ErrorStats) {
    s.push_str(&format!(
        "{label:>14} {name:>8} {:>10.1} {:>10.1} {:>12.1} {:>12.1} {:>12.1} {:>8}\n",
        e.mean_err_ns / 1e3,
        e.rms_err_ns / 1e3,
        e.p99_abs_err_ns as f64 / 1e3,
        e.p99_overshoot_ns as f64 / 1e3,
        e.max_overshoot_ns as f64 / 1e3,
        e.periods
    ));
}

fn lateness_text(l: &Lateness) -> String {
    format!(
        "{} (p50 {:.1} / p99 {:.1} / max {:.1} us)",
        l.count,
        l.p50_ns as f64 / 1e3,
        l.p99_ns as f64 / 1e3,
        l.max_ns as f64 / 1e3
    )
}

impl LimitResult {
    /// A table for people.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "bench limit: busy vCPUs held to {} periods per run, {} round(s) of each backend{}\n\
             {:>14} {:>8} {:>10} {:>10} {:>12} {:>12} {:>12} {:>8}\n",
            self.periods,
            self.rounds.len() / MEASUREMENTS.len(),
            if self.host.hogs > 0 {
                format!(", beside {} spinning host processes", self.host.hogs)
            } else {
                String::new()
            },
            "run",
            "backend",
            "mean us",
            "RMS us",
            "p99 |err| us",
            "p99 over us",
            "max over us",
            "periods"
        );
        let main = LimitRun {
            period_ns: self.period_ns,
            periods: self.periods,
            vmm: self.vmm.clone(),
            vmm_debt: self.vmm_debt.clone(),
            cgroup: match &self.cgroup {
                CgroupFigures::Measured(e) => e.clone(),
                CgroupFigures::Unavailable { .. } => ErrorStats::default(),
            },
            rms_ratio: self.rms_ratio,
            p99_ratio: self.p99_ratio,
            kicks: self.kicks.clone(),
            median_round: self.median_round,
        };
        for (r, &(period_ns, members)) in [&main, &self.at_10ms, &self.group_of_2]
            .into_iter()
            .zip(&MEASUREMENTS)
        {
            s += &self.measurement_text(r, period_ns, members);
        }
        if let CgroupFigures::Unavailable { unavailable } = &self.cgroup {
            s += &format!(
                "cgroup backend unavailable, the VMM backend ran alone (its rows are empty): {unavailable}\n"
            );
        }
        s += &format!(
            "host: {} CPUs, steal {:.2} % ({:.1} ms) over the bench, load average {:.1} -> {:.1}\n",
            self.host.cpus,
            self.host.steal_pct,
            self.host.steal_ns as f64 / 1e6,
            self.host.load_avg_start,
            self.host.load_avg_end
        );
        s + &format!("verdict: {}\n", self.verdict)
    }
    /// One measurement's rounds, median rounds, ratios and stops.
    fn measurement_text(&self, r: &LimitRun, period_ns: u64, members: usize) -> String {
        let mut s = String::new();
        let what = format!(
            "{} ms{}",
            period_ns / 1_000_000,
            if members > 1 {
                ", group of 2 (not in the verdict)"
            } else {
                ""
            }
        );
        s += &format!("{what}: each round (load average, host steal)\n");
        for round in self
            .rounds
            .iter()
            .filter(|x| x.period_ns == period_ns && x.members == members)
        {
            let label = format!(
                "#{} {:.1} {:.2}%",
                round.round, round.load_avg, round.host_steal_pct
            );
            error_row(&mut s, &label, LimitBackend::Vmm, &round.vmm);
            error_row(&mut s, "", LimitBackend::Cgroup, &round.cgroup);
        }
        error_row(
            &mut s,
            &format!("median #{}", r.median_round.vmm),
            LimitBackend::Vmm,
            &r.vmm,
        );
        error_row(
            &mut s,
            &format!("median #{}", r.median_round.cgroup),
            LimitBackend::Cgroup,
            &r.cgroup,
        );
        s += &format!(
            "{:>14} {:>8} {:>10.1} {:>10.1} {:>12.1} {:>12.1} {:>12.1} {:>8}\n",
            "median",
            "vmm+debt",
            r.vmm_debt.mean_err_ns / 1e3,
            r.vmm_debt.rms_err_ns / 1e3,
            r.vmm_debt.p99_abs_err_ns as f64 / 1e3,
            r.vmm_debt.p99_overshoot_ns as f64 / 1e3,
            r.vmm_debt.max_overshoot_ns as f64 / 1e3,
            r.vmm_debt.periods
        );
        s += &format!(
            "  ratios cgroup/vmm: RMS {:.1}, p99 |err| {:.1}; VMM stops: {} by timer ({} re-arms), {} by the limiter\n  lateness: limiter looks {}, timer kicks {}; CPU past the target at timer stops {}\n",
            r.rms_ratio,
            r.p99_ratio,
            r.kicks.timer_kicks,
            r.kicks.rearms,
            r.kicks.limiter_kicks,
            lateness_text(&r.kicks.looks),
            lateness_text(&r.kicks.timer),
            lateness_text(&r.kicks.timer_overrun),
        );
        let st = &r.kicks.stages;
        s += &format!(
            "  timer stop stages: to handler {}, to decision {}, spin to the target {} (mean {:.1} us), to park {}; signal to a spinning thread {}\n",
            lateness_text(&st.to_handler),
            lateness_text(&st.to_decision),
            lateness_text(&st.spin),
            st.spin_mean_ns as f64 / 1e3,
            lateness_text(&st.to_park),
            lateness_text(&st.signal_floor),
        );
        s
    }
}
