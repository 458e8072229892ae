//! Runaway detection (PPA requirement 20, `--runaway MS`): a vCPU that runs guest code on a
//! CPU for MS without an exit to the VMM, an idle park or a halt. A vCPU inside one KVM_RUN is
//! not necessarily running: a Linux guest's vCPU halts inside KVM_RUN (an in-kernel HLT) and
//! can stay there for seconds. So the detector asks the vCPU's own figures whether it ran:
//! over each interval between two of the sampler's reads, the vCPU must have been on a CPU or
//! waiting for one (used and steal) for at least [`RUNNING_SHARE_PCT`] % of its wall time,
//! never asleep inside KVM_RUN (halted or blocked) for more. An interval in which it slept
//! more starts the count again from there. What is counted is the CPU time (the thread's
//! clock) since the streak began, not its wall time: time waiting for a host CPU is the host's
//! doing, not the guest's, so a host that keeps a vCPU off its CPUs (an emulated nested host,
//! an overloaded one) makes no runaway of it. It fires when that CPU time reaches MS, once per
//! guest run (docs/limits.md, "Runaway and overload detection").
//!
//! Data flow: the sampler calls [`RunawayWatch::check`] every sampler tick (10 ms) with the
//! vCPU's micro-state and when its guest run began (its meter: no system call) and its latest
//! summary (the one the sampler read for the PPA page and pressure: thread CPU clock,
//! schedstat, KVM's halt statistics); a pure function of those, unit-tested.

use ppa_vmm_api::VcpuSummary;

/// Share of each interval the vCPU must have been running or runnable, percent.
pub const RUNNING_SHARE_PCT: u64 = 90;

/// What the detector needs of one summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    /// The vCPU's wall_ns.
    pub wall: u64,
    /// Its used_ns.
    pub used: u64,
    /// Asleep: halted + blocked + idle + limited + paused (ns).
    pub asleep: u64,
}

impl Figures {
    /// The figures of a summary.
    pub fn of(s: &VcpuSummary) -> Figures {
        Figures {
            wall: s.wall_ns,
            used: s.used_ns,
            asleep: s.halted_ns + s.blocked_ns + s.idle_ns + s.limited_ns + s.paused_ns,
        }
    }
}

/// A runaway found: how long the vCPU ran guest code and how much of it on a CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runaway {
    /// Wall time of the streak, ns.
    pub ns: u64,
    /// CPU time in it, ns.
    pub cpu_ns: u64,
}

/// One vCPU's runaway detection state.
#[derive(Debug, Clone, Default)]
pub struct RunawayWatch {
    /// The guest run watched (its start, as the meter gives it).
    run: Option<u64>,
    /// When the current streak of running began (CLOCK_MONOTONIC) and the figures then.
    streak: Option<(u64, Figures)>,
    /// The last figures looked at, and when.
    last: Option<(u64, Figures)>,
    /// Whether this run has fired.
    fired: bool,
}

impl RunawayWatch {
    /// One check at `now`: `in_guest` and `since` (the guest run's start; 0 when not timed),
    /// and the vCPU's latest figures with the time they were read. `limit_ns` is `--runaway`.
    pub fn check(
        &mut self,
        limit_ns: u64,
        in_guest: bool,
        since: u64,
        latest: Option<(u64, Figures)>,
        now: u64,
    ) -> Option<Runaway> {
        if !in_guest || since == 0 {
            *self = RunawayWatch::default();
            return None;
        }
        if self.run != Some(since) {
            // A new guest run: the streak is taken to begin with it, and the first interval
            // of figures checks that.
            *self = RunawayWatch {
                run: Some(since),
                ..RunawayWatch::default()
            };
        }
        let (at, f) = latest?;
        if at < since {
            return None;
        }
        match self.last.replace((at, f)) {
            None => {
                // The run's start comes before its first read: its CPU from the start to the
                // read (at most one sampler interval, which the next read judges) is taken as
                // on a CPU all along, so a spinning vCPU fires at MS and not an interval late.
                let base = Figures {
                    used: f.used.saturating_sub(at - since),
                    ..f
                };
                self.streak = Some((since, base));
                return None;
            }
            Some((prev_at, prev)) if at > prev_at && f.wall > prev.wall => {
                let wall = f.wall - prev.wall;
                let asleep = f.asleep.saturating_sub(prev.asleep);
                if asleep * 100 > wall * (100 - RUNNING_SHARE_PCT) {
                    // It slept in this interval: not running guest code. Count again from here.
                    self.streak = Some((at, f));
                    return None;
                }
            }
            // The same figures again (no new read since): nothing new to judge.
            Some(_) => return None,
        }
        let (start, base) = self.streak?;
        let cpu_ns = f.used.saturating_sub(base.used);
        if self.fired || cpu_ns < limit_ns {
            return None;
        }
        self.fired = true;
        Some(Runaway {
            ns: now.saturating_sub(start),
            cpu_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Feeds a vCPU that spends each 8 ms in `step` (used, asleep) through a check every
    /// 8 ms for `n` steps; returns the ms at which it fired.
    fn feed(limit_ms: u64, steps: &[(u64, u64)], n: usize, since: u64) -> Vec<u64> {
        let mut w = RunawayWatch::default();
        let mut f = Figures::default();
        let mut fired = Vec::new();
        for k in 1..=n as u64 {
            let (used, asleep) = steps[(k as usize - 1) % steps.len()];
            f.wall += 8 * MS;
            f.used += used * MS / 1000;
            f.asleep += asleep * MS / 1000;
            let now = since + k * 8 * MS;
            if w.check(limit_ms * MS, true, since, Some((now, f)), now)
                .is_some()
            {
                fired.push(k * 8);
            }
        }
        fired
    }

    #[test]
    fn a_spinning_vcpu_fires_once_per_run_at_the_limit() {
        // On a CPU all the time (8000 us of 8 ms).
        assert_eq!(feed(200, &[(8000, 0)], 100, 1), vec![200]);
        // Waiting for a CPU half the time: it never sleeps, and its CPU time reaches the limit
        // over twice the wall time.
        assert_eq!(feed(200, &[(4000, 0)], 150, 1), vec![400]);
        // A vCPU the host keeps off its CPUs 95 % of the time (14 ms of CPU in 211 ms of a
        // run, seen in an emulated nested host's boot) is no runaway at 200 ms.
        assert!(feed(200, &[(400, 0)], 100, 1).is_empty());
    }

    #[test]
    fn a_vcpu_halted_inside_kvm_run_never_fires() {
        // An idle Linux vCPU: asleep inside KVM_RUN nearly all the time, for 5 s of one run.
        assert!(feed(200, &[(40, 7960)], 625, 1).is_empty());
        // One that halts 20 % of the time (a periodic guest) is not a runaway either.
        assert!(feed(200, &[(6400, 1600)], 625, 1).is_empty());
    }

    #[test]
    fn a_halt_starts_the_count_again() {
        // Spins 160 ms, halts one 8 ms interval, spins on: the 200 ms count from the halt.
        let mut steps = vec![(8000, 0); 20];
        steps.push((0, 8000));
        steps.extend(vec![(8000, 0); 100]);
        assert_eq!(feed(200, &steps, 60, 1), vec![368]);
    }

    #[test]
    fn outside_the_guest_or_untimed_nothing_fires_and_a_new_run_may_fire_again() {
        let mut w = RunawayWatch::default();
        let f = |wall: u64, used: u64| {
            Some((
                wall,
                Figures {
                    wall,
                    used,
                    asleep: 0,
                },
            ))
        };
        assert_eq!(
            w.check(10 * MS, false, 5, f(100 * MS, 100 * MS), 100 * MS),
            None
        );
        assert_eq!(
            w.check(10 * MS, true, 0, f(100 * MS, 100 * MS), 100 * MS),
            None
        );
        // Run from 1 ms: figures at 8 and 16 ms, fires at the first check past 11 ms.
        assert_eq!(w.check(10 * MS, true, MS, f(8 * MS, 8 * MS), 8 * MS), None);
        let r = w.check(10 * MS, true, MS, f(16 * MS, 16 * MS), 16 * MS);
        assert_eq!(
            r,
            Some(Runaway {
                ns: 15 * MS,
                cpu_ns: 15 * MS
            })
        );
        assert_eq!(
            w.check(10 * MS, true, MS, f(24 * MS, 24 * MS), 24 * MS),
            None
        );
        // A new run (after an exit) can fire again.
        assert_eq!(
            w.check(10 * MS, true, 30 * MS, f(32 * MS, 32 * MS), 32 * MS),
            None
        );
        assert!(w
            .check(10 * MS, true, 30 * MS, f(40 * MS, 40 * MS), 41 * MS)
            .is_some());
    }
}
