//! Scheduling of the VMM's own service threads: the control socket's threads ask for a higher
//! CFS weight and a short EEVDF slice, the limiter for SCHED_FIFO; each falls back quietly
//! where the kernel or the privilege is missing, and says in the log what it got.
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
    let a = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        nice,
        runtime: slice_ns,
        ..Default::default()
    };
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

/// Asks SCHED_FIFO priority 1 for the calling thread (for threads whose lateness is an error:
/// the limiter); without the privilege, nice -10 and a short slice, and says so.
pub fn raise_realtime(what: &str) {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler on the calling thread (0) with a valid sched_param.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc != 0 {
        log::info!(
            "{what}: cannot use SCHED_FIFO ({})",
            io::Error::last_os_error()
        );
        raise_priority(API_NICE, what);
    } else {
        log::info!("{what}: SCHED_FIFO priority 1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
