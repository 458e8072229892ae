//! The kick timer's signal path measured alone, without KVM (`bench limit`, `probes`): a timer
//! made as a vCPU's is, fired while the calling thread spins.

use std::sync::atomic::Ordering;

use super::OsTimer;
use crate::accounting::histogram::{Histogram, HistogramSnapshot};
use crate::hypervisor::timer_signal::TimerFired;
use crate::sync::now_ns;

/// The kernel's part of a timer stop without KVM, for `bench limit`: `samples` firings of a
/// timer made as a vCPU's is (CLOCK_MONOTONIC, `SIGEV_THREAD_ID` at the calling thread,
/// `signal`, whose handler must call [`crate::hypervisor::timer_signal::mark_timer_fired`]), each armed
/// 300-1,000 µs ahead while the thread spins in user space, as a vCPU runs in the guest:
/// from the armed-for time to the handler, per firing (the hrtimer's expiry and the signal's
/// delivery to a running thread; what the vCPU's `to_handler` adds is leaving KVM_RUN).
pub fn signal_path(signal: libc::c_int, samples: usize) -> std::io::Result<HistogramSnapshot> {
    let fired = TimerFired::default();
    let timer = OsTimer::create(signal, &fired)?;
    let h = Histogram::new(3).expect("3 fractional bits are valid");
    for k in 0..samples {
        fired.fired.store(false, Ordering::Relaxed);
        // Spread the expiries over the tick: 300 µs to 1 ms ahead, not a multiple of it.
        let at = now_ns() + 300_000 + (k as u64 * 7_919) % 700_000;
        timer.set(at)?;
        let give_up = at + 20_000_000;
        while !fired.fired.load(Ordering::Acquire) && now_ns() < give_up {
            std::hint::spin_loop();
        }
        let handler = fired.at_ns.load(Ordering::Acquire);
        if fired.fired.load(Ordering::Acquire) && handler >= at {
            h.record(handler - at);
        }
    }
    timer.set(0)?;
    Ok(h.snapshot())
}
