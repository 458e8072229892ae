//! The sampler thread: reads each running vCPU thread's schedstat once per window.
//!
//! Data flow: while a `steal_window_ns` threshold is set, every `sample_interval_ns` (10 ms by
//! default) it reads run_delay of every vCPU whose thread has started and not finished, and
//! counts windows whose steal exceeded the threshold into that vCPU's `exceeded[StealWindow]`
//! counter (the sampler is that counter's only writer); with none it reads nothing. With
//! `--runaway` or `--overload` it also runs the detectors of `limits::overload` on every vCPU
//! and applies their action. Reading schedstat costs ~1 µs per vCPU here, which is why it
//! happens here and not on the exit path. With a PPA page it also refreshes the page's host
//! section every [`PAGE_REFRESH_NS`] (8 ms), on its own deadline between the ticks
//! (docs/abi.md). It stops when told, within one window.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use ppa_guest_abi::ppa_page::{HostVcpu, NOT_MEASURED};
use ppa_vmm_api::{Event, OverloadKind};

use crate::accounting::meter::MicroState;
use crate::accounting::{AccountingControl, Threshold};
use crate::api::EventHub;
use crate::handle::VmHandle;
use crate::limits::overload::{Action, Detector, Fired, OverloadConfig, WINDOW_NS};
use crate::ppa_page::PpaPage;
use crate::sync::{futex_wait, futex_wake, now_ns};
use crate::vcpu::{VcpuShared, VcpuState, REQ_PAUSE};

/// How often the PPA page's host records are refreshed. The ABI promises a record at most
/// `host_refresh_ns` (10 ms) old; refreshing every 8 ms leaves 2 ms for the sampler's
/// wake-up on a host whose CPUs are all running vCPU threads.
pub const PAGE_REFRESH_NS: u64 = 8_000_000;

/// A running sampler.
pub struct Sampler {
    stop: Arc<(AtomicBool, AtomicU32)>,
    handle: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts the sampler thread over `vcpus`, with runaway and overload detection when
    /// `overload` is given.
    pub fn start(
        vcpus: Vec<Arc<VcpuShared>>,
        control: Arc<AccountingControl>,
        overload: Option<Overload>,
        ppa: Option<(Arc<PpaPage>, VmHandle)>,
    ) -> std::io::Result<Sampler> {
        let stop = Arc::new((AtomicBool::new(false), AtomicU32::new(0)));
        let s = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("sampler".into())
            .spawn(move || run(&vcpus, &control, &s, overload, ppa))?;
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

/// What runaway and overload detection needs.
pub struct Overload {
    /// The settings.
    pub config: OverloadConfig,
    /// The VM (its limiter applies the throttle action; its uptime stamps the events).
    pub vm: VmHandle,
    /// Where the events go.
    pub hub: Arc<EventHub>,
}

impl Overload {
    /// Checks every vCPU; every `WINDOW_NS` also the overload windows.
    fn check(&self, vcpus: &[Arc<VcpuShared>], det: &mut [Detector], window: bool) {
        let now = now_ns();
        for (v, d) in vcpus.iter().zip(det.iter_mut()) {
            if v.state() != VcpuState::Running && v.state() != VcpuState::Parked {
                continue;
            }
            let m = v.acct.meter.read();
            let in_guest = m.micro_state() == MicroState::Guest;
            let mut fired = d.check_runaway(&self.config, in_guest, m.since, now);
            if window && fired.is_none() {
                if let Some(cpu) = v.acct.thread_cpu_ns() {
                    fired = d.check_window(&self.config, cpu, now);
                }
            }
            let Some(f) = fired else { continue };
            v.overloads.add(1);
            let (kind, detail) = match f {
                Fired::Runaway { ns } => (
                    OverloadKind::Runaway,
                    format!(
                        "in the guest for {:.1} ms without an exit or an idle",
                        ns as f64 / 1e6
                    ),
                ),
                Fired::Overload { per_mille, windows } => (
                    OverloadKind::Overload,
                    format!(
                        "used {:.1} % of the last window, above the limit for {windows} windows of 100 ms",
                        per_mille as f64 / 10.0
                    ),
                ),
            };
            match &self.config.action {
                Action::Notify => {}
                Action::Pause => v.kick(REQ_PAUSE),
                Action::Throttle(l, given) => self.vm.limiter().throttle_vcpu(v.id, *l, given),
            }
            self.hub.push(Event::Overload {
                uptime_ns: self.vm.uptime_ns(),
                vcpu: v.id,
                kind,
                detail,
                action: self.config.action.name(),
            });
        }
    }
}

/// Writes every started vCPU's figures into its host record of the PPA page.
fn publish(page: &PpaPage, vm: &VmHandle, vcpus: &[Arc<VcpuShared>]) {
    let updated_ns = vm.uptime_ns();
    for v in vcpus.iter().filter(|v| v.host_tid() != 0) {
        let t = v.summary();
        page.publish(
            v.id,
            &HostVcpu {
                seq: 0,
                vcpu: v.id as u32,
                updated_ns,
                wall_ns: t.wall_ns,
                used_ns: t.used_ns,
                guest_ns: t.guest_ns,
                vmm_ns: t.vmm_ns,
                steal_ns: t.steal_ns,
                halted_ns: t.halted_ns,
                idle_ns: t.idle_ns,
                limited_ns: t.limited_ns,
                paused_ns: t.paused_ns,
                exits: t.total_exits(),
                overloads: t.overloads,
                blocked_ns: t.blocked_ns,
                kvm_ns: t.kvm_ns.unwrap_or(NOT_MEASURED),
                interrupted_ns: t.interrupted_ns.unwrap_or(NOT_MEASURED),
            },
        );
    }
}

fn run(
    vcpus: &[Arc<VcpuShared>],
    control: &AccountingControl,
    stop: &(AtomicBool, AtomicU32),
    overload: Option<Overload>,
    ppa: Option<(Arc<PpaPage>, VmHandle)>,
) {
    crate::seccomp::enter(crate::seccomp::Kind::Sampler);
    let mut detectors = vec![Detector::default(); vcpus.len()];
    let mut ticks = 0u64;
    let mut last: Vec<Option<u64>> = vec![None; vcpus.len()];
    // Not at nice -10 like the socket threads: a sampler that wakes every 8 ms with a higher
    // weight preempts vCPU threads on their own CPU, and on the development hosts that moved
    // 1-2 % of a busy vCPU's time from guest code into exit handling (measured by
    // tests/accounting.rs, whose guest-time checks then failed).
    let interval = control.sample_interval_ns().max(1_000_000);
    let mut next = now_ns() + interval;
    let mut next_page = now_ns();
    while !stop.0.load(Ordering::Acquire) {
        let seen = stop.1.load(Ordering::Acquire);
        let now = now_ns();
        let wake = if ppa.is_some() {
            next.min(next_page)
        } else {
            next
        };
        if now < wake {
            futex_wait(&stop.1, seen, Some(wake));
            continue;
        }
        if let Some((page, vm)) = &ppa {
            if now >= next_page {
                publish(page, vm, vcpus);
                next_page = (next_page + PAGE_REFRESH_NS).max(now + PAGE_REFRESH_NS / 2);
            }
        }
        if now < next {
            continue;
        }
        let threshold = control.threshold(Threshold::StealWindow);
        // One window per wake-up; if the thread was held up, start a fresh window from now
        // rather than lumping several windows into one. With nothing to do (no steal-window
        // threshold, no detection) it looks again in IDLE_NS.
        let step = if threshold == 0 && overload.is_none() {
            IDLE_NS.max(interval)
        } else {
            interval
        };
        next = (next + step).max(now + step / 2);
        steal_window(vcpus, &mut last, threshold, |v| {
            v.acct.live.get()?.sched.read().ok().map(|s| s.run_delay_ns)
        });
        if let Some(o) = &overload {
            ticks += 1;
            let window = ticks % (WINDOW_NS / interval).max(1) == 0;
            o.check(vcpus, &mut detectors, window);
        }
    }
}

/// How long the sampler waits, with no steal-window threshold and no runaway or overload
/// detection, before it looks whether a threshold was set (a threshold set at run time
/// starts counting within it).
const IDLE_NS: u64 = 100_000_000;

/// One steal window: counts into `exceeded[StealWindow]` each running vCPU whose run_delay
/// (read by `run_delay`) grew by more than `threshold` since `prev`. With no threshold it
/// reads nothing and forgets `prev`, so that a threshold set later compares whole windows:
/// at 64 busy vCPUs the schedstat reads of every 10 ms window cost the sampler ~0.7 % of a
/// CPU on the development host, for a counter that is off by default.
fn steal_window(
    vcpus: &[Arc<VcpuShared>],
    prev: &mut [Option<u64>],
    threshold: u64,
    run_delay: impl Fn(&VcpuShared) -> Option<u64>,
) {
    for (v, prev) in vcpus.iter().zip(prev.iter_mut()) {
        if threshold == 0 || v.acct.finals.get().is_some() {
            *prev = None;
            continue;
        }
        let Some(d) = run_delay(v) else {
            continue;
        };
        if prev.is_some_and(|p| d.saturating_sub(p) > threshold) {
            v.acct.meter.exceeded[Threshold::StealWindow].add(1);
        }
        *prev = Some(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn steal_windows_are_read_only_with_a_threshold_and_count_what_exceeds_it() {
        let vm = crate::api::tests_support::handle(2);
        let vcpus = vm.vcpus();
        let mut prev = vec![None; 2];
        let reads = Cell::new(0);
        let delay = Cell::new(0u64);
        let read = |v: &VcpuShared| {
            reads.set(reads.get() + 1);
            Some(delay.get() * (v.id as u64 + 1))
        };
        let exceeded = |i: usize| vcpus[i].acct.meter.exceeded[Threshold::StealWindow].get();
        // Off: no schedstat read at all.
        steal_window(vcpus, &mut prev, 0, read);
        assert_eq!(reads.get(), 0);
        // On: the first window only sets the base.
        steal_window(vcpus, &mut prev, 1_000, read);
        assert_eq!(reads.get(), 2);
        assert_eq!((exceeded(0), exceeded(1)), (0, 0));
        // vCPU 0 waited 800 ns in the window, vCPU 1 1 600 ns: only vCPU 1 is over 1 000.
        delay.set(800);
        steal_window(vcpus, &mut prev, 1_000, read);
        assert_eq!((exceeded(0), exceeded(1)), (0, 1));
        // Off again, then on: the window before it is forgotten, not counted.
        steal_window(vcpus, &mut prev, 0, read);
        delay.set(100_000);
        steal_window(vcpus, &mut prev, 1_000, read);
        assert_eq!((exceeded(0), exceeded(1)), (0, 1));
        assert_eq!(reads.get(), 6);
    }
}
