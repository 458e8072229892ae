//! Thresholds inside the guest (PPA requirement 17, ppactl's thresholds): per thread, its
//! run-queue wait per wait, its on-CPU time per timeslice and its involuntary switches per
//! sample interval; per CPU, its hard-interrupt and softirq time per interval. Each time one
//! exceeds its threshold it counts once for that thread or CPU and makes an
//! [`Occurrence`], which the publisher writes into the alarm ring.
//!
//! The agent samples; it sees each thread's totals, not each wait or slice. So a sample
//! interval in which a thread's *mean* wait per wait (its run-queue wait over the timeslices
//! that began in it) exceeds the threshold counts once, with that mean as the value: at least
//! one wait exceeded it. Likewise a slice: the interval's on-CPU time over its timeslices; a
//! thread that stayed on its CPU across intervals without a switch is in one slice, which
//! counts once, when its length so far passes the threshold. Involuntary switches are read
//! where the agent reads a thread's `status` (the threads it publishes), and counted per
//! interval since the last read. docs/agent.md, "Thresholds and alarms", defines each.
//!
//! Data flow: the collector keeps a [`ThreadWatch`] per thread and the previous CPU records,
//! and after each sample calls [`ThreadWatch::check`] for every thread whose schedstat or
//! status it read, and [`check_cpu`] for every CPU; pure functions, unit-tested.

use ppa_guest_abi::ppa_page::alarms::{AlarmKind, ALARM_KINDS};
use ppa_guest_abi::ppa_page::{GuestCpu, COMM_LEN};

use crate::procfs::SchedStat;

/// The thresholds in force (0: off), by [`AlarmKind`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Thresholds(pub [u64; ALARM_KINDS]);

impl Thresholds {
    /// The threshold of `k`.
    pub fn of(&self, k: AlarmKind) -> u64 {
        self.0[k as usize - 1]
    }

    /// Sets the threshold of `k`.
    pub fn set(&mut self, k: AlarmKind, v: u64) {
        self.0[k as usize - 1] = v;
    }

    /// Whether any is on.
    pub fn any(&self) -> bool {
        self.0.iter().any(|&t| t != 0)
    }
}

/// A threshold exceeded in one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occurrence {
    /// Which threshold.
    pub kind: AlarmKind,
    /// The thread (0 for a CPU's).
    pub tid: u32,
    /// The CPU it is about, or the thread's last one.
    pub cpu: u32,
    /// The thread's name (empty for a CPU).
    pub comm: [u8; COMM_LEN],
    /// What was measured.
    pub value: u64,
    /// The threshold.
    pub threshold: u64,
}

/// A thread's state for its thresholds between samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadWatch {
    prev: Option<SchedStat>,
    /// On-CPU time of the slice in progress as far as the samples saw (no switch since).
    slice_ns: u64,
    slice_counted: bool,
    /// The last `nivcsw` read, and at which sample.
    nivcsw: Option<(u64, u64)>,
    /// Occurrences so far, by thread kind: run delay, slice, nivcsw.
    pub over: [u64; 3],
}

impl ThreadWatch {
    /// One sample (number `sample`) of a thread: `sched` now, and `nivcsw` where its status
    /// was read in this sample. Each threshold exceeded counts in [`ThreadWatch::over`] and is
    /// given to `found` with its value.
    pub fn check(
        &mut self,
        th: &Thresholds,
        sched: SchedStat,
        nivcsw: Option<u64>,
        sample: u64,
        mut found: impl FnMut(AlarmKind, u64, u64),
    ) {
        if let Some(prev) = self.prev.replace(sched) {
            let ran = sched.on_cpu_ns.saturating_sub(prev.on_cpu_ns);
            let slices = sched.timeslices.saturating_sub(prev.timeslices);
            let waited = sched.run_delay_ns.saturating_sub(prev.run_delay_ns);
            let t = th.of(AlarmKind::RunDelay);
            if t != 0 && slices > 0 && waited / slices > t {
                self.over[0] += 1;
                found(AlarmKind::RunDelay, waited / slices, t);
            }
            let t = th.of(AlarmKind::Slice);
            match ran.checked_div(slices) {
                None => {
                    // Still in the slice it was in: one slice, counted once.
                    self.slice_ns += ran;
                    if t != 0 && !self.slice_counted && self.slice_ns > t {
                        self.slice_counted = true;
                        self.over[1] += 1;
                        found(AlarmKind::Slice, self.slice_ns, t);
                    }
                }
                Some(mean) => {
                    if t != 0 && mean > t {
                        self.over[1] += 1;
                        found(AlarmKind::Slice, mean, t);
                    }
                    // The new slice's length so far is not known: it counts from here.
                    self.slice_ns = 0;
                    self.slice_counted = false;
                }
            }
        }
        if let Some(n) = nivcsw {
            if let Some((prev, at)) = self.nivcsw.replace((n, sample)) {
                let t = th.of(AlarmKind::Nivcsw);
                let per = n.saturating_sub(prev) / sample.saturating_sub(at).max(1);
                if t != 0 && per > t {
                    self.over[2] += 1;
                    found(AlarmKind::Nivcsw, per, t);
                }
            }
        }
    }
}

/// One sample of a CPU: its record now and at the previous sample; each of its thresholds
/// exceeded counts in `over` (irq, softirq) and is given to `found`.
pub fn check_cpu(
    th: &Thresholds,
    prev: &GuestCpu,
    cur: &GuestCpu,
    over: &mut [u64; 2],
    mut found: impl FnMut(AlarmKind, u64, u64),
) {
    for (i, (kind, now, then)) in [
        (AlarmKind::Irq, cur.irq_ns, prev.irq_ns),
        (AlarmKind::Softirq, cur.softirq_ns, prev.softirq_ns),
    ]
    .into_iter()
    .enumerate()
    {
        let t = th.of(kind);
        let d = now.saturating_sub(then);
        if t != 0 && d > t {
            over[i] += 1;
            found(kind, d, t);
        }
    }
}

impl super::Collector {
    /// After a sample: every thread's and CPU's thresholds, their counts into the records,
    /// the occurrences into [`super::Collector::occurrences`] (threads first, by tid, then
    /// CPUs).
    pub(super) fn check_thresholds(&mut self) {
        self.found.clear();
        let th = self.opts.thresholds;
        let sample = self.samples;
        let mut tids: Vec<u32> = self.threads.keys().copied().collect();
        tids.sort_unstable();
        for tid in tids {
            let Some(t) = self.threads.get_mut(&tid) else {
                continue;
            };
            let nivcsw = (t.nivcsw_at == sample).then_some(t.info.nivcsw);
            let info = &t.info;
            let found = &mut self.found;
            t.watch
                .check(&th, info.sched, nivcsw, sample, |kind, value, threshold| {
                    found.push(Occurrence {
                        kind,
                        tid: info.tid,
                        cpu: info.last_cpu,
                        comm: info.comm,
                        value,
                        threshold,
                    })
                });
            t.info.over = t.watch.over;
        }
        let n = self.cpus.nr_cpus() as usize;
        self.cpu_over.resize(n, [0; 2]);
        self.cpu_prev.resize(n, None);
        let cur: Vec<(usize, GuestCpu)> = self.cpus.records().map(|(i, r)| (i, *r)).collect();
        for (i, c) in cur {
            if let Some(prev) = self.cpu_prev[i].replace(c) {
                let found = &mut self.found;
                check_cpu(
                    &th,
                    &prev,
                    &c,
                    &mut self.cpu_over[i],
                    |kind, value, threshold| {
                        found.push(Occurrence {
                            kind,
                            tid: 0,
                            cpu: c.cpu,
                            comm: [0; COMM_LEN],
                            value,
                            threshold,
                        })
                    },
                );
            }
        }
    }

    /// This sample's threshold occurrences.
    pub fn occurrences(&self) -> &[Occurrence] {
        &self.found
    }

    /// CPU `i`'s threshold counts (irq, softirq).
    pub fn cpu_over(&self, i: usize) -> [u64; 2] {
        self.cpu_over.get(i).copied().unwrap_or_default()
    }

    /// The thresholds in force.
    pub fn thresholds(&self) -> Thresholds {
        self.opts.thresholds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn sched(on_ms: u64, wait_ms: u64, slices: u64) -> SchedStat {
        SchedStat {
            on_cpu_ns: on_ms * MS,
            run_delay_ns: wait_ms * MS,
            timeslices: slices,
        }
    }

    fn th(kind: AlarmKind, v: u64) -> Thresholds {
        let mut t = Thresholds::default();
        t.set(kind, v);
        t
    }

    fn run(
        w: &mut ThreadWatch,
        t: &Thresholds,
        s: SchedStat,
        n: Option<u64>,
        k: u64,
    ) -> Vec<(AlarmKind, u64)> {
        let mut v = Vec::new();
        w.check(t, s, n, k, |kind, value, _| v.push((kind, value)));
        v
    }

    #[test]
    fn a_mean_wait_over_the_threshold_counts_once_per_interval() {
        let t = th(AlarmKind::RunDelay, 5 * MS);
        let mut w = ThreadWatch::default();
        assert!(
            run(&mut w, &t, sched(0, 0, 0), None, 1).is_empty(),
            "first sample: a base"
        );
        // 4 waits of 24 ms in all: 6 ms each on average.
        assert_eq!(
            run(&mut w, &t, sched(10, 24, 4), None, 2),
            vec![(AlarmKind::RunDelay, 6 * MS)]
        );
        // 10 waits of 40 ms: 4 ms each, under.
        assert!(run(&mut w, &t, sched(20, 64, 14), None, 3).is_empty());
        // No wait ended in the interval: nothing to judge.
        assert!(run(&mut w, &t, sched(30, 64, 14), None, 4).is_empty());
        assert_eq!(w.over, [1, 0, 0]);
    }

    #[test]
    fn a_long_slice_counts_once_and_a_mean_per_slice_once_per_interval() {
        let t = th(AlarmKind::Slice, 50 * MS);
        let mut w = ThreadWatch::default();
        run(&mut w, &t, sched(0, 0, 1), None, 1);
        // On its CPU without a switch: 30, 60 (over: once), 90 ms (the same slice).
        assert!(run(&mut w, &t, sched(30, 0, 1), None, 2).is_empty());
        assert_eq!(
            run(&mut w, &t, sched(60, 0, 1), None, 3),
            vec![(AlarmKind::Slice, 60 * MS)]
        );
        assert!(run(&mut w, &t, sched(90, 0, 1), None, 4).is_empty());
        // Two slices in an interval, 120 ms in all: 60 ms each.
        assert_eq!(
            run(&mut w, &t, sched(210, 0, 3), None, 5),
            vec![(AlarmKind::Slice, 60 * MS)]
        );
        // Ten short slices: none.
        assert!(run(&mut w, &t, sched(220, 0, 13), None, 6).is_empty());
        assert_eq!(w.over, [0, 2, 0]);
    }

    #[test]
    fn involuntary_switches_count_per_interval_since_the_last_read() {
        let t = th(AlarmKind::Nivcsw, 100);
        let mut w = ThreadWatch::default();
        run(&mut w, &t, sched(0, 0, 0), Some(10), 1);
        assert_eq!(
            run(&mut w, &t, sched(1, 0, 1), Some(211), 2),
            vec![(AlarmKind::Nivcsw, 201)]
        );
        // 300 more over three intervals: 100 a sample, not over.
        assert!(run(&mut w, &t, sched(2, 0, 2), Some(511), 5).is_empty());
        // Not read in this sample: nothing.
        assert!(run(&mut w, &t, sched(3, 0, 3), None, 6).is_empty());
        assert_eq!(w.over, [0, 0, 1]);
    }

    #[test]
    fn thresholds_at_zero_are_off() {
        let mut w = ThreadWatch::default();
        let t = Thresholds::default();
        run(&mut w, &t, sched(0, 0, 0), Some(0), 1);
        assert!(run(&mut w, &t, sched(1000, 1000, 1), Some(1_000_000), 2).is_empty());
        assert!(!t.any());
    }

    #[test]
    fn a_cpus_interrupt_time_per_interval() {
        let t = Thresholds([0, 0, 0, 2 * MS, 3 * MS]);
        let prev = GuestCpu {
            irq_ns: 10 * MS,
            softirq_ns: 10 * MS,
            ..Default::default()
        };
        let cur = GuestCpu {
            irq_ns: 13 * MS,
            softirq_ns: 12 * MS,
            ..Default::default()
        };
        let mut over = [0; 2];
        let mut v = Vec::new();
        check_cpu(&t, &prev, &cur, &mut over, |k, value, th| {
            v.push((k, value, th))
        });
        assert_eq!(v, vec![(AlarmKind::Irq, 3 * MS, 2 * MS)]);
        assert_eq!(over, [1, 0]);
    }
}
