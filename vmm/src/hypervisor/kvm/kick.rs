//! Kicking a KVM vCPU thread out of KVM_RUN: a signal whose handler sets `immediate_exit`.
//!
//! A kick from another thread is a signal ([`kick_signal`]) sent to the vCPU thread with
//! tgkill ([`SignalKicker`]). If the thread is inside KVM_RUN, the signal makes KVM_RUN return
//! EINTR. If it is outside (handling an exit, or parked), the handler, which runs on the vCPU
//! thread itself, sets `kvm_run.immediate_exit` through a thread-local pointer, so that the
//! next KVM_RUN returns at once instead of entering the guest and losing the kick (the pattern
//! Firecracker uses). The run loop clears `immediate_exit` ([`super::KvmVcpu`]'s `clear_kick`)
//! before it reads its request bits, so a kick that was already acted on (a parked vCPU woken by
//! it) does not also cost an `intr` exit on the next entry.
//!
//! The same signal is what a vCPU's kick timer delivers (`vcpu::kick_timer`: a POSIX timer the
//! vCPU thread aims at itself): the handler then also records the firing (a flag and the time)
//! in the timer's `TimerFired`, whose address the timer carries as its value
//! (`hypervisor::timer_signal::mark_timer_fired`).
//!
//! The thread-local pointer is set by `KvmVcpu::bind_thread` (unsafe: the caller promises to
//! unbind before the vCPU is dropped or leaves the thread) and cleared by `unbind_thread`.

use std::cell::Cell;
use std::sync::Once;

use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

thread_local! {
    static IMMEDIATE_EXIT: Cell<*mut u8> = const { Cell::new(std::ptr::null_mut()) };
}

/// The signal that kicks a vCPU thread.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: `info` is the kernel's siginfo (the handler is installed with SA_SIGINFO); the
    // only timers that deliver the kick signal are the vCPUs' kick timers
    // (`vcpu::kick_timer`), whose value points at their `fired` flag, alive as long as the
    // timer (it lives in the vCPU's shared state, which outlives the thread's timer).
    unsafe { crate::hypervisor::timer_signal::mark_timer_fired(info) };
    let p = IMMEDIATE_EXIT.with(Cell::get);
    if !p.is_null() {
        // SAFETY: a non-null pointer was registered by `set_immediate_exit_ptr` on this thread,
        // whose caller guarantees it points at a live `immediate_exit` byte until it is reset
        // to null on this same thread. A volatile byte store is async-signal-safe.
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
///
/// # Safety
/// `p` must be null, or point at a byte that stays valid for writes until this function is
/// called again with null on the same thread: the signal handler writes through it whenever a
/// kick signal reaches this thread.
pub unsafe fn set_immediate_exit_ptr(p: *mut u8) {
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

/// The kicker of a KVM vCPU: the kick signal to the thread the vCPU is bound to.
#[derive(Debug, Clone, Copy)]
pub struct SignalKicker {
    tid: libc::pid_t,
}

impl SignalKicker {
    /// A kicker for thread `tid`.
    pub fn new(tid: libc::pid_t) -> Self {
        SignalKicker { tid }
    }
}

impl crate::hypervisor::Kicker for SignalKicker {
    fn kick(&self) {
        signal_thread(self.tid);
    }

    fn timer_signal(&self) -> Option<libc::c_int> {
        Some(kick_signal())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kick_handler_sets_the_registered_byte() {
        install_handler().unwrap();
        let mut byte = 0u8;
        // SAFETY: `byte` outlives the registration, which is reset to null below on this
        // thread before `byte` goes out of scope.
        unsafe { set_immediate_exit_ptr(&mut byte) };
        // SAFETY: gettid has no preconditions.
        signal_thread(unsafe { libc::gettid() });
        // SAFETY: null is always allowed.
        unsafe { set_immediate_exit_ptr(std::ptr::null_mut()) };
        // SAFETY: reading a local the handler may have written through a pointer.
        assert_eq!(unsafe { std::ptr::read_volatile(&byte) }, 1);
        // With no registration the handler writes nothing (and the process survives).
        // SAFETY: gettid has no preconditions.
        signal_thread(unsafe { libc::gettid() });
    }
}
