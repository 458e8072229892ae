//! The sampler thread: reads each running vCPU thread's schedstat once per window.
//!
//! Data flow: every `sample_interval_ns` (10 ms by default) it reads run_delay of every vCPU
//! whose thread has started and not finished, and counts windows whose steal exceeded the
//! `steal_window_ns` threshold into that vCPU's `steal_windows` counter (the sampler is that
//! counter's only writer). Reading schedstat costs ~1 µs per vCPU here, which is why it happens
//! here and not on the exit path. It stops when told, within one window.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::accounting::AccountingControl;
use crate::kick::{futex_wait, futex_wake, now_ns};
use crate::vcpu::VcpuShared;

/// A running sampler.
pub struct Sampler {
    stop: Arc<(AtomicBool, AtomicU32)>,
    handle: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts the sampler thread over `vcpus`.
    pub fn start(
        vcpus: Vec<Arc<VcpuShared>>,
        control: Arc<AccountingControl>,
    ) -> std::io::Result<Sampler> {
        let stop = Arc::new((AtomicBool::new(false), AtomicU32::new(0)));
        let s = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("sampler".into())
            .spawn(move || run(&vcpus, &control, &s))?;
        Ok(Sampler {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops and joins the thread.
    pub fn stop(mut self) {
        self.stop.0.store(true, Ordering::Release);
        futex_wake(&self.stop.1);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn run(vcpus: &[Arc<VcpuShared>], control: &AccountingControl, stop: &(AtomicBool, AtomicU32)) {
    let mut last: Vec<Option<u64>> = vec![None; vcpus.len()];
    let interval = control.sample_interval_ns().max(1_000_000);
    let mut next = now_ns() + interval;
    while !stop.0.load(Ordering::Acquire) {
        let seen = stop.1.load(Ordering::Acquire);
        if now_ns() < next {
            futex_wait(&stop.1, seen, Some(next));
            continue;
        }
        // One window per wake-up; if the thread was held up, start a fresh window from now
        // rather than lumping several windows into one.
        next = (next + interval).max(now_ns() + interval / 2);
        let threshold = control.threshold(3);
        for (v, prev) in vcpus.iter().zip(last.iter_mut()) {
            if v.acct.finals.get().is_some() {
                continue;
            }
            let Some(live) = v.acct.live.get() else {
                continue;
            };
            let Ok(s) = live.sched.read() else {
                continue;
            };
            if let Some(p) = *prev {
                if threshold != 0 && s.run_delay_ns.saturating_sub(p) > threshold {
                    v.acct.steal_windows.add(1);
                }
            }
            *prev = Some(s.run_delay_ns);
        }
    }
}
