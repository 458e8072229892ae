//! Reset (PPA design requirement 6, `ppa-vmm ctl guest-reset`): the agent's figures start
//! again from 0 without losing track of anything. At a reset the collector keeps each live
//! thread's and each CPU's figures as a baseline; what it publishes afterwards is the figures
//! less their baseline ([`since`], [`cpu_since`]), a thread that starts later counting from its
//! start. The exit totals restart at 0 and an exit after the reset adds the thread's CPU less
//! its baseline, so every sum the agent keeps (records, aggregate and transient figures) counts
//! from the reset as it counted from the agent's start. Threshold counts restart at 0; the
//! alarm ring's numbers do not (a reader keeps its place in it). Exited threads still listed
//! from before the reset are dropped: their figures are all before it.
//!
//! Data flow: the agent's loop sees the host's request in the page's VM record and calls
//! [`super::Collector::reset`] after a sample; the publisher asks [`super::Collector::base`]
//! and [`super::Collector::cpu_base`] for each record it writes.

use ppa_guest_abi::ppa_page::{GuestCpu, DELAY_KINDS};

use super::ThreadInfo;

/// `cur` less `base` (its figures at the reset; none: a thread that started after it),
/// field by field, never below 0.
pub fn since(cur: &ThreadInfo, base: Option<&ThreadInfo>) -> ThreadInfo {
    let Some(b) = base else {
        return *cur;
    };
    let d = |a: u64, b: u64| a.saturating_sub(b);
    let mut t = *cur;
    t.sched.on_cpu_ns = d(cur.sched.on_cpu_ns, b.sched.on_cpu_ns);
    t.sched.run_delay_ns = d(cur.sched.run_delay_ns, b.sched.run_delay_ns);
    t.sched.timeslices = d(cur.sched.timeslices, b.sched.timeslices);
    t.utime_ns = d(cur.utime_ns, b.utime_ns);
    t.stime_ns = d(cur.stime_ns, b.stime_ns);
    t.nvcsw = d(cur.nvcsw, b.nvcsw);
    t.nivcsw = d(cur.nivcsw, b.nivcsw);
    for k in 0..DELAY_KINDS {
        t.delays[k] = d(cur.delays[k], b.delays[k]);
        t.delay_counts[k] = d(cur.delay_counts[k], b.delay_counts[k]);
    }
    t
}

/// A CPU record less its baseline (its figures at the reset).
pub fn cpu_since(cur: &GuestCpu, base: Option<&GuestCpu>) -> GuestCpu {
    let Some(b) = base else {
        return *cur;
    };
    let d = |a: u64, b: u64| a.saturating_sub(b);
    let mut c = *cur;
    c.user_ns = d(cur.user_ns, b.user_ns);
    c.system_ns = d(cur.system_ns, b.system_ns);
    c.idle_ns = d(cur.idle_ns, b.idle_ns);
    c.iowait_ns = d(cur.iowait_ns, b.iowait_ns);
    c.irq_ns = d(cur.irq_ns, b.irq_ns);
    c.softirq_ns = d(cur.softirq_ns, b.softirq_ns);
    c.steal_ns = d(cur.steal_ns, b.steal_ns);
    c.interrupts = d(cur.interrupts, b.interrupts);
    c.context_switches = d(cur.context_switches, b.context_switches);
    for k in 0..c.softirqs.len() {
        c.softirqs[k] = d(cur.softirqs[k], b.softirqs[k]);
    }
    c
}

impl super::Collector {
    /// Restarts the figures from the last sample's: every live thread's and CPU's become
    /// their baseline, the exit totals and the threshold counts restart at 0, and exited
    /// threads still listed are forgotten.
    pub fn reset(&mut self) {
        self.bases = self.threads.iter().map(|(&tid, t)| (tid, t.info)).collect();
        for t in self.threads.values_mut() {
            t.watch.over = [0; 3];
            t.info.over = [0; 3];
        }
        self.cpu_base = self.cpus.records().map(|(_, r)| Some(*r)).collect();
        for o in &mut self.cpu_over {
            *o = [0; 2];
        }
        let lost = self.totals.exits_lost;
        self.totals = super::Totals {
            exits_lost: lost,
            ..Default::default()
        };
        self.lingering.clear();
        let threads = &self.threads;
        self.selected.retain(|tid| threads.contains_key(tid));
    }

    /// Thread `tid`'s baseline, if it was alive at the last reset.
    pub fn base(&self, tid: u32) -> Option<&ThreadInfo> {
        self.bases.get(&tid)
    }

    /// CPU record `i`'s baseline, if there was a reset.
    pub fn cpu_base(&self, i: usize) -> Option<&GuestCpu> {
        self.cpu_base.get(i).and_then(Option::as_ref)
    }

    /// The on-CPU time of `tid` at the reset (0: none), what its exit counts less.
    pub(super) fn base_on_cpu(&self, tid: u32) -> u64 {
        self.bases.get(&tid).map_or(0, |b| b.sched.on_cpu_ns)
    }

    /// Forgets the baselines of threads that are neither alive nor listed as exited.
    pub(super) fn forget_bases(&mut self) {
        if self.bases.is_empty() {
            return;
        }
        let (threads, lingering) = (&self.threads, &self.lingering);
        self.bases
            .retain(|tid, _| threads.contains_key(tid) || lingering.get(*tid).is_some());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs::SchedStat;

    #[test]
    fn figures_since_a_reset_are_the_figures_less_their_baseline() {
        let base = ThreadInfo {
            sched: SchedStat {
                on_cpu_ns: 100,
                run_delay_ns: 10,
                timeslices: 5,
            },
            utime_ns: 60,
            stime_ns: 40,
            nvcsw: 3,
            nivcsw: 2,
            delays: [1; DELAY_KINDS],
            delay_counts: [1; DELAY_KINDS],
            ..Default::default()
        };
        let cur = ThreadInfo {
            sched: SchedStat {
                on_cpu_ns: 250,
                run_delay_ns: 30,
                timeslices: 9,
            },
            utime_ns: 150,
            stime_ns: 100,
            nvcsw: 7,
            nivcsw: 2,
            delays: [4; DELAY_KINDS],
            delay_counts: [2; DELAY_KINDS],
            over: [1, 0, 0],
            tid: 9,
            ..Default::default()
        };
        let s = since(&cur, Some(&base));
        assert_eq!(
            (s.sched.on_cpu_ns, s.sched.run_delay_ns, s.sched.timeslices),
            (150, 20, 4)
        );
        assert_eq!((s.utime_ns, s.stime_ns, s.nvcsw, s.nivcsw), (90, 60, 4, 0));
        assert_eq!((s.delays, s.delay_counts), ([3; 7], [1; 7]));
        // What is no figure stays: the tid, the threshold counts (restarted at the reset).
        assert_eq!((s.tid, s.over), (9, [1, 0, 0]));
        // A thread started after the reset counts from its start; a baseline above the
        // figure (a tid reused) gives 0, never an underflow.
        assert_eq!(since(&cur, None), cur);
        assert_eq!(since(&base, Some(&cur)).sched.on_cpu_ns, 0);
        let c = GuestCpu {
            user_ns: 5,
            softirqs: [2; 10],
            ..Default::default()
        };
        let b = GuestCpu {
            user_ns: 3,
            softirqs: [1; 10],
            ..Default::default()
        };
        let s = cpu_since(&c, Some(&b));
        assert_eq!((s.user_ns, s.softirqs), (2, [1; 10]));
    }
}
