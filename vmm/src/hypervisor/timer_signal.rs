//! The contract between a vCPU's kick timer and a backend's kick signal: what the signal's
//! handler does when a POSIX timer sent it.
//!
//! Data flow: a backend whose kicks are signals names its signal in
//! `Kicker::timer_signal`; the vCPU thread's kick timer (`vcpu::kick_timer`) then aims a POSIX
//! timer at itself with that signal and a pointer to its `fired` flag as the timer's value.
//! Each backend's handler (KVM's `kvm::kick`, the tests' fake) passes its `siginfo` to
//! [`mark_timer_fired`], which sets that flag. It sits beside the seam, not in one backend,
//! because every backend with signal kicks keeps the same contract.

/// For a kick signal's handler: when the signal came from a POSIX timer (`SI_TIMER`) whose
/// value is a non-null pointer, sets the `AtomicBool` it points at (async-signal-safe: one
/// atomic store).
///
/// # Safety
/// `info` must be null or the `siginfo_t` the kernel passed to the handler, and every POSIX
/// timer that delivers this signal to this process must carry a null value or a pointer to an
/// `AtomicBool` that stays valid for as long as the timer can fire.
pub unsafe fn mark_timer_fired(info: *const libc::siginfo_t) {
    if info.is_null() {
        return;
    }
    // SAFETY: `info` is the kernel's siginfo for this delivery (caller's contract); reading
    // `si_code`, then the `_rt` member when the code says a timer sent it, is what the kernel
    // filled in.
    let p = unsafe {
        if (*info).si_code != libc::SI_TIMER {
            return;
        }
        (*info).si_value().sival_ptr as *const std::sync::atomic::AtomicBool
    };
    if !p.is_null() {
        // SAFETY: a timer's non-null value points at a live AtomicBool (caller's contract).
        unsafe { (*p).store(true, std::sync::atomic::Ordering::Relaxed) };
    }
}
