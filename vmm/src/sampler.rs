//! The sampler thread: reads each running vCPU thread's schedstat once per window.
//!
//! Data flow: every `sample_interval_ns` (10 ms by default) it reads run_delay of every vCPU
//! whose thread has started and not finished, and counts windows whose steal exceeded the
//! `steal_window_ns` threshold into that vCPU's `exceeded[StealWindow]` counter (the sampler is
//! that counter's only writer). With `--runaway` or `--overload` it also runs the detectors of
//! `limits::overload` on every vCPU and applies their action. Reading schedstat costs ~1 µs
//! per vCPU here, which is why it happens here and not on the exit path. With a PPA page it
//! also refreshes the page's host section every [`PAGE_REFRESH_NS`] (8 ms), on its own
//! deadline between the ticks (docs/abi.md). It stops when told, within one window.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use ppa_guest_abi::ppa_page::HostVcpu;
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
                reserved: [0; 3],
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
        // One window per wake-up; if the thread was held up, start a fresh window from now
        // rather than lumping several windows into one.
        next = (next + interval).max(now + interval / 2);
        let threshold = control.threshold(Threshold::StealWindow);
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
                    v.acct.meter.exceeded[Threshold::StealWindow].add(1);
                }
            }
            *prev = Some(s.run_delay_ns);
        }
        if let Some(o) = &overload {
            ticks += 1;
            let window = ticks % (WINDOW_NS / interval).max(1) == 0;
            o.check(vcpus, &mut detectors, window);
        }
    }
}
