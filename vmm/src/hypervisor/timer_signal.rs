//! The contract between a vCPU's kick timer and a backend's kick signal: what the signal's
//! handler does when a POSIX timer sent it.
//!
//! Data flow: a backend whose kicks are signals names its signal in
//! `Kicker::timer_signal`; the vCPU thread's kick timer (`vcpu::kick_timer`) then aims a POSIX
//! timer at itself with that signal and a pointer to its [`TimerFired`] as the timer's value.
//! Each backend's handler (KVM's `kvm::kick`, the tests' fake) passes its `siginfo` to
//! [`mark_timer_fired`], which records the firing and its time. It sits beside the seam, not in one backend,
//! because every backend with signal kicks keeps the same contract.

/// What a kick timer's signal handler writes ([`mark_timer_fired`]): that it fired, and when
/// the handler ran (the stages of a stop, docs/limits.md).
#[derive(Debug, Default)]
pub struct TimerFired {
    /// Set when the timer's signal arrived.
    pub fired: std::sync::atomic::AtomicBool,
    /// CLOCK_MONOTONIC ns at which the handler last ran for this timer.
    pub at_ns: std::sync::atomic::AtomicU64,
}

/// For a kick signal's handler: when the signal came from a POSIX timer (`SI_TIMER`) whose
/// value is a non-null pointer, stores the time in, and sets the flag of, the [`TimerFired`]
/// it points at (async-signal-safe: a vDSO clock read and two atomic stores).
///
/// # Safety
/// `info` must be null or the `siginfo_t` the kernel passed to the handler, and every POSIX
/// timer that delivers this signal to this process must carry a null value or a pointer to a
/// [`TimerFired`] that stays valid for as long as the timer can fire.
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
        (*info).si_value().sival_ptr as *const TimerFired
    };
    if !p.is_null() {
        // SAFETY: a timer's non-null value points at a live TimerFired (caller's contract).
        let t = unsafe { &*p };
        t.at_ns
            .store(crate::sync::now_ns(), std::sync::atomic::Ordering::Relaxed);
        t.fired.store(true, std::sync::atomic::Ordering::Release);
    }
}
