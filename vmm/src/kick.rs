//! Kicking a vCPU thread out of KVM_RUN or out of a park, and parking it.
//!
//! A kick is three steps: set a request bit the vCPU loop reads, bump a futex word (wakes a
//! parked vCPU), and send [`kick_signal`] to the thread. The signal handler runs on the vCPU
//! thread itself and sets `kvm_run.immediate_exit` through a thread-local pointer, so a kick that
//! lands just before KVM_RUN makes KVM_RUN return at once instead of being lost (the pattern
//! Firecracker uses). Parking is a futex wait with an absolute CLOCK_MONOTONIC deadline: no lock,
//! nothing a reader could hold.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

thread_local! {
    static IMMEDIATE_EXIT: Cell<*mut u8> = const { Cell::new(std::ptr::null_mut()) };
}

/// The signal that kicks a vCPU thread.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let p = IMMEDIATE_EXIT.with(Cell::get);
    if !p.is_null() {
        // SAFETY: the pointer was set by `set_immediate_exit_ptr` on this thread to the
        // `immediate_exit` byte of this thread's mmapped kvm_run, which stays mapped until the
        // thread clears the pointer before dropping the vCPU fd. A volatile byte store is
        // async-signal-safe.
        unsafe { std::ptr::write_volatile(p, 1) };
    }
}

/// Installs the kick signal handler once per process.
pub fn install_handler() -> Result<(), vmm_sys_util::errno::Error> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| result = register_signal_handler(kick_signal(), on_kick));
    result
}

/// Tells this thread's kick handler where `immediate_exit` is (null to forget it).
pub fn set_immediate_exit_ptr(p: *mut u8) {
    IMMEDIATE_EXIT.with(|c| c.set(p));
}

/// Sends the kick signal to thread `tid` of this process (tgkill: safe even if the thread has
/// exited, which gives ESRCH; a reused tid is another thread of this process, where the handler
/// finds no registered byte and does nothing).
pub fn signal_thread(tid: libc::pid_t) {
    // SAFETY: tgkill takes plain integers and touches no memory of ours; the signal has a
    // handler installed by `install_handler`, so it cannot kill the process.
    unsafe {
        libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, kick_signal());
    }
}

/// Monotonic time in ns (vDSO, no syscall).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Waits on `word` while it equals `seen`, until `deadline_ns` (CLOCK_MONOTONIC) if given. Returns
/// when woken, interrupted, timed out or when the word already changed: callers re-check their
/// condition.
pub fn futex_wait(word: &AtomicU32, seen: u32, deadline_ns: Option<u64>) {
    let ts = deadline_ns.map(|d| libc::timespec {
        tv_sec: (d / 1_000_000_000) as libc::time_t,
        tv_nsec: (d % 1_000_000_000) as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a valid aligned u32 for the duration of the call; `ts_ptr` is null or
    // points at a live timespec; FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG,
            seen,
            ts_ptr,
            std::ptr::null::<u32>(),
            libc::FUTEX_BITSET_MATCH_ANY,
        );
    }
}

/// Bumps `word` and wakes every waiter on it.
pub fn futex_wake(word: &AtomicU32) {
    word.fetch_add(1, Ordering::Release);
    // SAFETY: `word` is a valid aligned u32; FUTEX_WAKE only reads its address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn futex_wait_returns_on_deadline_and_on_wake() {
        let w = AtomicU32::new(0);
        let before = now_ns();
        futex_wait(&w, 0, Some(before + 2_000_000));
        assert!(now_ns() >= before + 2_000_000, "woke before the deadline");
        // A changed word returns at once even with no deadline.
        futex_wait(&w, 1, None);

        let w = Arc::new(AtomicU32::new(0));
        let w2 = Arc::clone(&w);
        let t = std::thread::spawn(move || {
            while w2.load(Ordering::Acquire) == 0 {
                futex_wait(&w2, 0, None);
            }
        });
        futex_wake(&w);
        t.join().unwrap();
        assert_eq!(w.load(Ordering::Acquire), 1);
    }

    #[test]
    fn kick_handler_sets_the_registered_byte() {
        install_handler().unwrap();
        let mut byte = 0u8;
        set_immediate_exit_ptr(&mut byte);
        // SAFETY: gettid has no preconditions.
        signal_thread(unsafe { libc::gettid() });
        set_immediate_exit_ptr(std::ptr::null_mut());
        // SAFETY: reading a local the handler may have written through a pointer.
        assert_eq!(unsafe { std::ptr::read_volatile(&byte) }, 1);
    }
}
