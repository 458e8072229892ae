//! The PPA guest agent (`ppa-agent`, spec section 8a, docs/agent.md): a Linux daemon that
//! finds the PPA page PPA-VMM shares with its guest and keeps the page's guest section
//! current with precise per-thread and per-CPU accounting.
//!
//! Data flow, once per interval: [`discover`] finds the page (CPUID leaves, `ppa.page=` on the
//! kernel command line, or `--page-file`); [`page`] maps it and refuses one it does not
//! understand; [`collect`] samples /proc through files it keeps open (schedstat, stat and
//! status of the threads that ran, system-wide CPU files) and counts the tasks that exited,
//! from [`taskstats`] exit notifications where the kernel and its capabilities allow;
//! [`publish`] writes the result into the guest section with the sequence protocol of
//! `ppa_guest_abi::ppa_page`, its busiest threads plus one aggregate when they exceed the
//! page's capacity, and its own cost. [`agent`] runs that loop; [`show`] prints the host's
//! figures for the guest's vCPUs; [`bench`] measures the cost per sample.

pub mod agent;
pub mod bench;
pub mod collect;
pub mod config;
pub mod discover;
pub mod page;
pub mod procfs;
pub mod publish;
pub mod show;
pub mod taskstats;

/// An error and its causes as one sentence: `outer: cause: cause`.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Reads clock `id`, ns; `None` when the kernel refuses (a process clock of a process that
/// is gone).
pub fn clock_ns(id: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the kernel to fill; the result is checked.
    let r = unsafe { libc::clock_gettime(id, &mut ts) };
    (r == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// One zeroed page shared with the children this process forks (an anonymous shared
/// mapping), for a child to leave figures in or for futex words; `None` if it cannot be
/// mapped. It is never unmapped: whoever forks may still use it until the process ends.
pub fn shared_page() -> Option<std::ptr::NonNull<u8>> {
    // SAFETY: a new anonymous mapping at an address the kernel chooses touches no existing
    // memory; the result is checked.
    let mem = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if mem == libc::MAP_FAILED {
        return None;
    }
    std::ptr::NonNull::new(mem.cast::<u8>())
}

/// CLOCK_MONOTONIC, ns: the guest clock of every `updated_ns` the agent writes.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0)
}

/// The calling thread's CPU time, ns.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0)
}

/// The CPU clock of process `pid` (all its threads, those that exited included), as Linux's
/// `MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)` names it. Any process's clock may be read.
pub fn process_clock(pid: u32) -> libc::clockid_t {
    ((!pid) << 3) as libc::clockid_t | 2
}

/// Tests that sample this process's threads, or start and end threads, run one at a time:
/// a thread another test starts between two samples would change what a sample sees.
#[cfg(test)]
pub(crate) fn threads_serial() -> std::sync::MutexGuard<'static, ()> {
    static THREADS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    THREADS.lock().unwrap_or_else(|e| e.into_inner())
}
