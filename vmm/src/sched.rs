//! Scheduling of the VMM's own service threads: the limiter, the stats refresher and the
//! `api` thread ask for SCHED_FIFO (the `api` thread under an [`RtGuard`] that drops it to
//! the fair class while it uses more than its CPU budget); without the privilege they take a
//! higher CFS weight and a short EEVDF slice. Each says in the log what it got.
//!
//! Why SCHED_FIFO for the `api` thread after all: measured on the development host (64 busy
//! vCPU threads on 2 CPUs, 1000 `stats`/s), a woken `api` thread at nice −10 with the 100 µs
//! slice still lost the pick to the vCPU thread with the earliest deadline (one that had
//! waited ~100 ms): server p99 3.4–3.9 ms; at SCHED_FIFO 10–47 µs, with the same throughput
//! ratio. The earlier finding that SCHED_FIFO cost guest throughput was with the client at
//! SCHED_FIFO too (docs/design.md).
//!
//! Why a short slice: with every host CPU running vCPU threads, a woken `api` thread at nice
//! −10 could still wait up to a scheduler tick (4 ms here) behind the vCPU thread on its CPU:
//! EEVDF let the running thread finish its slice (RUN_TO_PARITY). Since Linux 6.12 a
//! SCHED_OTHER thread may ask for its own slice (`sched_setattr` with `sched_runtime`); a
//! thread whose slice is shorter than the running one's preempts it on wake-up
//! (PREEMPT_SHORT), and its short requests get early deadlines. SCHED_FIFO did the same for
//! the `api` thread but let it, and the snapshot it takes, run ahead of every vCPU thread, which
//! cost guest throughput; a slice costs only where the thread has work. On older kernels the
//! slice is ignored (`sched_getattr` then reports none) and the nice value alone applies.

use std::io;

/// Nice value of the `api` thread: the control socket must answer promptly even when every
/// host CPU runs vCPU threads, and its work per request is small and bounded.
pub const API_NICE: i32 = -10;

/// The slice the service threads ask for (the kernel's minimum, 0.1 ms): shorter than the
/// vCPU threads' default (0.75 ms × (1 + log2 CPUs)), so a wake-up preempts them.
pub const SERVICE_SLICE_NS: u64 = 100_000;

/// `struct sched_attr` (SCHED_ATTR_SIZE_VER1).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

fn getattr() -> io::Result<SchedAttr> {
    let mut a = SchedAttr::default();
    // SAFETY: sched_getattr of the calling thread (0) writes at most `size` bytes into `a`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut a,
            std::mem::size_of::<SchedAttr>() as u32,
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(a)
}

fn setattr(nice: i32, slice_ns: u64) -> io::Result<()> {
    setattr_raw(SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        nice,
        runtime: slice_ns,
        ..Default::default()
    })
}

fn setattr_raw(a: SchedAttr) -> io::Result<()> {
    // SAFETY: sched_setattr of the calling thread (0) reads `a`, whose `size` is its size.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &a, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs the calling thread may run on (its affinity mask; `[0]` if it cannot be read).
/// New threads inherit it, so for the VMM's threads it bounds how many vCPU threads can be on
/// a CPU at once.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size into it.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        set
    };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE; CPU_ISSET reads the set.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// What a service thread got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// Its nice value now.
    pub nice: i32,
    /// Its custom slice, ns (`None`: the kernel's default, e.g. before Linux 6.12).
    pub slice_ns: Option<u64>,
}

/// Asks `nice` and [`SERVICE_SLICE_NS`] for the calling thread, keeping what the kernel and
/// the privilege allow: without CAP_SYS_NICE the nice value stays, the slice still applies
/// (it needs no privilege); a kernel without custom slices keeps its default.
pub fn service_thread(nice: i32) -> Applied {
    if setattr(nice, SERVICE_SLICE_NS).is_err() {
        // EPERM: a lower nice value needs CAP_SYS_NICE; keep the current one.
        let current = getattr().map_or(0, |a| a.nice);
        if setattr(current, SERVICE_SLICE_NS).is_err() {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            // SAFETY: setpriority takes plain integers; PRIO_PROCESS with a tid applies to
            // that thread only on Linux.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
        }
    }
    match getattr() {
        Ok(a) => Applied {
            nice: a.nice,
            slice_ns: (a.runtime == SERVICE_SLICE_NS).then_some(a.runtime),
        },
        Err(_) => Applied {
            nice: 0,
            slice_ns: None,
        },
    }
}

/// Raises the calling thread's scheduling weight to `nice` with a short slice (best effort:
/// see [`service_thread`]), and says what applied.
pub fn raise_priority(nice: i32, what: &str) {
    let got = service_thread(nice);
    let slice = match got.slice_ns {
        Some(ns) => format!("a {} µs slice", ns / 1000),
        None => "the kernel's default slice (custom slices need Linux 6.12)".to_string(),
    };
    if got.nice == nice && got.slice_ns.is_some() {
        log::info!("{what}: nice {nice} with {slice}");
    } else {
        log::info!(
            "{what}: nice {} (asked {nice}: raising it needs CAP_SYS_NICE) with {slice}",
            got.nice
        );
    }
}

/// SCHED_FIFO priority of the `api` and `api-stats` threads.
pub const SERVICE_RT_PRIORITY: u32 = 1;

/// SCHED_FIFO priority of the limiter: above the service threads, so that a metrics render on
/// the `api` thread never holds up a limit stop on its CPU.
pub const LIMITER_RT_PRIORITY: u32 = 2;

/// Asks SCHED_FIFO at `priority` for the calling thread (for threads whose lateness is an
/// error, and whose CPU is bounded: the limiter, the stats refresher, the `api` thread under
/// its [`RtGuard`]); without the privilege, nice -10 and a short slice, and says so. Returns
/// whether the thread got SCHED_FIFO.
pub fn raise_realtime(what: &str, priority: u32) -> bool {
    match setattr_raw(fifo(priority)) {
        Ok(()) => {
            log::info!("{what}: SCHED_FIFO priority {priority}");
            true
        }
        Err(e) => {
            log::info!("{what}: cannot use SCHED_FIFO ({e})");
            raise_priority(API_NICE, what);
            false
        }
    }
}

fn fifo(priority: u32) -> SchedAttr {
    SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_FIFO as u32,
        priority,
        ..Default::default()
    }
}

/// Prepares the calling thread for an [`RtGuard`]: it takes [`Class::Fair`] first (so its
/// nice value is −10 wherever it falls back to it), then SCHED_FIFO as [`raise_realtime`].
/// Returns whether the thread got SCHED_FIFO. It keeps CAP_SYS_NICE (its seccomp filter
/// lets it change only its own class) so that it can take SCHED_FIFO back.
pub fn raise_guarded(what: &str) -> bool {
    let _ = set_class(Class::Fair);
    raise_realtime(what, SERVICE_RT_PRIORITY)
}

/// A service thread's scheduling class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// SCHED_FIFO at [`SERVICE_RT_PRIORITY`]: runs as soon as it is woken, ahead of every
    /// vCPU thread.
    Realtime,
    /// SCHED_OTHER at [`API_NICE`] with [`SERVICE_SLICE_NS`]: shares the CPU by weight.
    Fair,
}

/// Puts the calling thread in `class` (sched_setattr on itself: the only form the `api`
/// thread's seccomp filter allows).
pub fn set_class(class: Class) -> io::Result<()> {
    let size = std::mem::size_of::<SchedAttr>() as u32;
    setattr_raw(match class {
        Class::Realtime => fifo(SERVICE_RT_PRIORITY),
        Class::Fair => SchedAttr {
            size,
            policy: libc::SCHED_OTHER as u32,
            nice: API_NICE,
            runtime: SERVICE_SLICE_NS,
            ..Default::default()
        },
    })
}

/// The `api` thread's CPU budget at SCHED_FIFO, per mille of one CPU over [`RT_WINDOW_NS`].
/// Normal use is far below it (1000 `stats` a second: ~0.9 %; a 64-vCPU metrics render, at
/// most one per 100 ms: up to ~10 %); a flood of requests from a hostile local client is not,
/// and must not take a CPU from the guests at real-time priority. In the fair class at nice
/// −10 against 32 vCPU threads a CPU, the thread gets about 22 % of it.
pub const RT_BUDGET_PER_MILLE: u64 = 200;

/// The window over which [`RtGuard`] measures.
pub const RT_WINDOW_NS: u64 = 100_000_000;

/// Keeps a SCHED_FIFO service thread to its budget: while it uses more than
/// [`RT_BUDGET_PER_MILLE`] of a CPU in a window it drops to [`Class::Fair`] (where it weighs
/// as a nice −10 thread, as before SCHED_FIFO), and it returns to [`Class::Realtime`] after a
/// window within the budget. A pure state machine over (time, the thread's CPU time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtGuard {
    window_start_ns: u64,
    cpu_at_start_ns: u64,
    class: Class,
}

impl RtGuard {
    /// A guard for a thread now in [`Class::Realtime`].
    pub fn new(now_ns: u64, cpu_ns: u64) -> Self {
        RtGuard {
            window_start_ns: now_ns,
            cpu_at_start_ns: cpu_ns,
            class: Class::Realtime,
        }
    }

    /// The class the thread should be in now.
    pub fn class(&self) -> Class {
        self.class
    }

    /// Looks at the thread's CPU time `cpu_ns` at `now_ns`; returns the class to switch to
    /// when it changes.
    pub fn check(&mut self, now_ns: u64, cpu_ns: u64) -> Option<Class> {
        let used = cpu_ns.saturating_sub(self.cpu_at_start_ns);
        let budget = RT_WINDOW_NS * RT_BUDGET_PER_MILLE / 1000;
        let elapsed = now_ns.saturating_sub(self.window_start_ns);
        let next = if elapsed >= RT_WINDOW_NS {
            // A window (or a longer quiet spell, judged by its rate) is over.
            self.window_start_ns = now_ns;
            self.cpu_at_start_ns = cpu_ns;
            if u128::from(used) * 1000 > u128::from(elapsed) * u128::from(RT_BUDGET_PER_MILLE) {
                Class::Fair
            } else {
                Class::Realtime
            }
        } else if used > budget {
            Class::Fair
        } else {
            self.class
        };
        (next != self.class).then(|| {
            self.class = next;
            next
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_guard_demotes_a_thread_over_its_budget_and_restores_it_after_a_quiet_window() {
        let mut g = RtGuard::new(0, 0);
        // 10 ms of CPU in 50 ms: within 20 %.
        assert_eq!(g.check(50 * MS, 10 * MS), None);
        // 20.1 ms before the window ends: over, at once.
        assert_eq!(g.check(60 * MS, 20 * MS + 100_000), Some(Class::Fair));
        assert_eq!(g.class(), Class::Fair);
        // The next window starts with the flood still on: stays fair.
        assert_eq!(g.check(100 * MS, 40 * MS), None);
        assert_eq!(g.check(150 * MS, 60 * MS), None);
        // That window used 40 ms: still over at its end.
        assert_eq!(g.check(200 * MS, 80 * MS), None);
        assert_eq!(g.class(), Class::Fair);
        // A window with 2 ms: back to real time at its end.
        assert_eq!(g.check(300 * MS, 82 * MS), Some(Class::Realtime));
        // A long idle spell counts as one quiet window.
        assert_eq!(g.check(10_000 * MS, 83 * MS), None);
        assert_eq!(g.class(), Class::Realtime);
        // A flood that stops mid-window: the first look after a quiet spell restores it.
        assert_eq!(g.check(10_050 * MS, 113 * MS), Some(Class::Fair));
        assert_eq!(g.check(30_000 * MS, 113 * MS), Some(Class::Realtime));
    }

    #[test]
    fn the_guard_allows_exactly_its_budget() {
        let budget = RT_WINDOW_NS * RT_BUDGET_PER_MILLE / 1000;
        let mut g = RtGuard::new(7, 1000);
        assert_eq!(g.check(7 + RT_WINDOW_NS - 1, 1000 + budget), None);
        assert_eq!(
            g.check(7 + RT_WINDOW_NS - 1, 1001 + budget),
            Some(Class::Fair)
        );
    }

    #[test]
    fn a_guarded_thread_changes_class_both_ways_with_the_api_threads_capabilities() {
        let got = std::thread::spawn(|| {
            if !raise_guarded("test") {
                return None; // not privileged: nothing to check
            }
            let keep = crate::seccomp::allow::kept_caps(crate::seccomp::Kind::Api);
            crate::seccomp::caps::drop_all_but(keep).unwrap();
            let down = set_class(Class::Fair).map(|()| getattr().unwrap());
            let up = set_class(Class::Realtime).map(|()| getattr().unwrap().policy);
            Some((down.map(|a| (a.policy, a.nice)), up))
        })
        .join()
        .unwrap();
        if let Some((down, up)) = got {
            assert_eq!(down.unwrap(), (libc::SCHED_OTHER as u32, API_NICE));
            assert_eq!(up.unwrap(), libc::SCHED_FIFO as u32);
        }
    }

    #[test]
    fn a_thread_moves_between_the_classes_when_privileged() {
        let got = std::thread::spawn(|| {
            let mut seen = Vec::new();
            if set_class(Class::Realtime).is_ok() {
                seen.push(getattr().unwrap().policy);
                set_class(Class::Fair).unwrap();
                let a = getattr().unwrap();
                seen.push(a.policy);
                seen.push(a.nice as u32);
            }
            seen
        })
        .join()
        .unwrap();
        // Without CAP_SYS_NICE SCHED_FIFO is refused and there is nothing to check.
        if !got.is_empty() {
            assert_eq!(
                got,
                [
                    libc::SCHED_FIFO as u32,
                    libc::SCHED_OTHER as u32,
                    API_NICE as u32
                ]
            );
        }
    }

    #[test]
    fn a_service_thread_gets_its_slice_and_reports_it() {
        let (got, attr) = std::thread::spawn(|| (service_thread(API_NICE), getattr().unwrap()))
            .join()
            .unwrap();
        assert_eq!(attr.nice, got.nice);
        assert_eq!(
            got.slice_ns.is_some(),
            attr.runtime == SERVICE_SLICE_NS,
            "{attr:?}"
        );
        assert_eq!(attr.policy, libc::SCHED_OTHER as u32);
        // A 6.12+ kernel (this project's hosts run 6.18) keeps the slice asked for.
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        if (major, minor) >= (6, 12) {
            assert_eq!(got.slice_ns, Some(SERVICE_SLICE_NS), "{attr:?}");
        }
    }
}
