//! Scheduling of the VMM's own service threads: the control socket's threads ask for a higher
//! CFS weight, the limiter for SCHED_FIFO; both fall back quietly without the privilege.

use std::io;

/// Nice value of the `api` thread: the control socket must answer promptly even when every
/// host CPU runs vCPU threads, and its work per request is small and bounded.
pub const API_NICE: i32 = -10;

/// Raises the calling thread's scheduling weight to `nice` (best effort: without
/// CAP_SYS_NICE it stays as it is, and says so once).
pub fn raise_priority(nice: i32, what: &str) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority takes plain integers; PRIO_PROCESS with a tid applies to that
    // thread only on Linux.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc != 0 {
        log::info!(
            "{what}: cannot raise the thread's priority to nice {nice}: {}",
            io::Error::last_os_error()
        );
    }
}

/// Asks SCHED_FIFO priority 1 for the calling thread (for threads whose lateness is an error:
/// the limiter); without the privilege, nice -10, and says so.
pub fn raise_realtime(what: &str) {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler on the calling thread (0) with a valid sched_param.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc != 0 {
        log::info!(
            "{what}: cannot use SCHED_FIFO ({}); running at nice {API_NICE}",
            io::Error::last_os_error()
        );
        raise_priority(API_NICE, what);
    }
}
