//! The sampler thread: reads each running vCPU thread's schedstat once per window.
//!
//! Data flow: while a `steal_window_ns` threshold is set, every `sample_interval_ns` (10 ms by
//! default) it reads run_delay of every vCPU whose thread has started and not finished, and
//! counts windows whose steal exceeded the threshold into that vCPU's `exceeded[StealWindow]`
//! counter (the sampler is that counter's only writer); with none it reads nothing. With
//! `--runaway` it runs [`runaway`]'s detector on every vCPU against the latest summaries (a
//! vCPU halted inside KVM_RUN is not running), with `--overload` the windows of
//! `limits::overload`, and applies their action. Reading schedstat costs ~1 µs per vCPU here,
//! which is why it happens here and not on the exit path. Every [`PAGE_REFRESH_NS`] (8 ms), on
//! its own deadline between the ticks, it reads each started vCPU's summary once and hands it
//! to the pressure tracker (`pressure.rs`: some/full from the vCPUs' intervals at level full,
//! else estimated; averages; the board the socket reads) and, with
//! a PPA page, writes it into the page's host records and the VM record (docs/abi.md); a VM
//! without a page whose vCPUs are quiet is refreshed less often, down to every
//! [`QUIET_REFRESH_NS`] ([`refresh_step`]). It stops when told, within one window.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use ppa_guest_abi::ppa_page::{
    HostVcpu, HostVm, NOT_MEASURED, VM_HOST_CPU, VM_NET, VM_PRESSURE, VM_PRESSURE_ESTIMATED,
};
use ppa_vmm_api::{Event, OverloadKind, VcpuSummary};

use crate::accounting::meter::MicroState;
use crate::accounting::{AccountingControl, Threshold};
use crate::event_hub::EventHub;
use crate::handle::VmHandle;
use crate::limits::overload::{Action, Detector, Fired, OverloadConfig, WINDOW_NS};
use crate::ppa_page::alarms::AlarmReader;
use crate::ppa_page::{HostWriter, PpaPage};
use crate::pressure::reader::{Gathered, VcpuReader};
use crate::pressure::timeline::Seg;
use crate::pressure::Tracker;
use crate::sync::{futex_wait, futex_wake, now_ns};
use crate::vcpu::{Requests, ThreadState, VcpuShared};
use runaway::{Figures, RunawayWatch};

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
    /// Starts the sampler thread over `vm`'s vCPUs, with runaway and overload detection when
    /// `overload` is given.
    /// `halts`: the guest halts inside KVM_RUN (an in-kernel irqchip), so that a vCPU thread
    /// asleep in KVM_RUN is halted, not blocked, for pressure. `hub` takes the guest agent's
    /// alarms as `guest-alarm` events.
    pub fn start(
        vm: VmHandle,
        control: Arc<AccountingControl>,
        overload: Option<Overload>,
        halts: bool,
        hub: Arc<EventHub>,
    ) -> std::io::Result<Sampler> {
        let stop = Arc::new((AtomicBool::new(false), AtomicU32::new(0)));
        let s = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("sampler".into())
            .spawn(move || {
                if let Some(b) = vm.placement() {
                    b.register_current("sampler");
                }
                run(&vm, &control, &s, overload, (halts, hub))
            })?;
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

/// Each vCPU's detectors: runaway ([`runaway`]) and overload windows (`limits::overload`).
#[derive(Default, Clone)]
struct Detectors {
    runaway: RunawayWatch,
    overload: Detector,
}

impl Overload {
    /// Checks every vCPU against its latest summary (`latest`: when the sampler read them,
    /// and each vCPU's); every `WINDOW_NS` also the overload windows.
    fn check(
        &self,
        vcpus: &[Arc<VcpuShared>],
        det: &mut [Detectors],
        latest: (u64, &[Option<VcpuSummary>]),
        window: bool,
    ) {
        let now = now_ns();
        for (v, d) in vcpus.iter().zip(det.iter_mut()) {
            if v.state() != ThreadState::Running && v.state() != ThreadState::Parked {
                continue;
            }
            let mut fired = None;
            if let Some(limit) = self.config.runaway_ns {
                let m = v.acct.meter.read();
                let in_guest = m.micro_state() == MicroState::Guest;
                let figures = latest
                    .1
                    .get(v.id)
                    .and_then(Option::as_ref)
                    .map(|s| (latest.0, Figures::of(s)));
                fired = d
                    .runaway
                    .check(limit, in_guest, m.since, figures, now)
                    .map(|r| {
                        (
                            OverloadKind::Runaway,
                            format!(
                                "ran guest code on a CPU for {:.1} ms without an exit, an idle or \
                                 a halt (over {:.1} ms, the rest waiting for a CPU)",
                                r.cpu_ns as f64 / 1e6,
                                r.ns.max(r.cpu_ns) as f64 / 1e6
                            ),
                        )
                    });
            }
            if window && fired.is_none() {
                if let Some(cpu) = v.acct.thread_cpu_ns() {
                    fired = d
                        .overload
                        .check_window(&self.config, cpu, now)
                        .map(overload_detail);
                }
            }
            let Some((kind, detail)) = fired else {
                continue;
            };
            v.overloads.add(1);
            match &self.config.action {
                Action::Notify => {}
                Action::Pause => v.kick(Requests::PAUSE),
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

/// The event's kind and sentence of an overload window detection.
fn overload_detail(f: Fired) -> (OverloadKind, String) {
    let Fired::Overload { per_mille, windows } = f;
    (
        OverloadKind::Overload,
        format!(
            "used {:.1} % of the last window, above the limit for {windows} windows of 100 ms",
            per_mille as f64 / 10.0
        ),
    )
}

/// Each started vCPU's summary (`None` before its thread starts): one read per vCPU, shared
/// by the page and the pressure tracker.
fn summaries(vcpus: &[Arc<VcpuShared>]) -> Vec<Option<VcpuSummary>> {
    vcpus
        .iter()
        .map(|v| (v.host_tid() != 0).then(|| v.summary()))
        .collect()
}

/// Writes every started vCPU's figures into its host record of the PPA page.
fn publish(page: &mut HostWriter<'_>, updated_ns: u64, summaries: &[Option<VcpuSummary>]) {
    for t in summaries.iter().flatten() {
        page.publish(
            t.id,
            &HostVcpu {
                seq: 0,
                vcpu: t.id as u32,
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

/// How many page refreshes reuse one reading of the VMM's other threads' CPU (~100 ms): it
/// reads every vCPU thread's CPU clock (a system call each), which every 8 ms would cost
/// ~0.5 % of a CPU at 64 vCPUs.
const SERVICE_CPU_EVERY: u64 = 12;

/// What the VM record says of the VMM's other threads and of the network devices, read every
/// [`SERVICE_CPU_EVERY`] refreshes.
#[derive(Debug, Clone, Copy, Default)]
struct Slow {
    devices_ns: u64,
    service_ns: u64,
    net: Option<[u64; 5]>,
}

impl Slow {
    /// The device threads' and the service threads' CPU, and the network devices' frames,
    /// bytes and drops (transmit, receive), summed.
    fn read(vm: &VmHandle) -> Slow {
        use ppa_vmm_api::QueueKind;
        let cpu = vm.host_cpu_ns();
        let stats = vm.device_stats();
        let mut net = [0u64; 5];
        for q in stats.iter().flat_map(|d| d.queues.iter()) {
            match q.kind {
                QueueKind::Tx => {
                    net[0] += q.packets;
                    net[2] += q.bytes;
                }
                QueueKind::Rx => {
                    net[1] += q.packets;
                    net[3] += q.bytes;
                }
                _ => {}
            }
            net[4] += q.drops.values().sum::<u64>();
        }
        Slow {
            devices_ns: cpu.devices,
            service_ns: cpu.service,
            net: (!stats.is_empty()).then_some(net),
        }
    }
}

/// The VM record of the PPA page: pressure, the host CPU of the vCPU threads (their
/// summaries), of the device threads and of the others, and the network devices' totals.
fn vm_record(
    vm: &VmHandle,
    updated_ns: u64,
    summaries: &[Option<VcpuSummary>],
    slow: &Slow,
) -> HostVm {
    let p = vm.pressure().vm();
    let [tx, rx, tx_bytes, rx_bytes, drops] = slow.net.unwrap_or_default();
    let estimated = if p.estimated {
        VM_PRESSURE_ESTIMATED
    } else {
        0
    };
    HostVm {
        flags: VM_PRESSURE | VM_HOST_CPU | estimated | if slow.net.is_some() { VM_NET } else { 0 },
        updated_ns,
        host_cpu_vcpus_ns: summaries.iter().flatten().map(|t| t.used_ns).sum(),
        host_cpu_devices_ns: slow.devices_ns,
        host_cpu_service_ns: slow.service_ns,
        net_tx_packets: tx,
        net_rx_packets: rx,
        net_tx_bytes: tx_bytes,
        net_rx_bytes: rx_bytes,
        net_drops: drops,
        pressure_some_total_us: p.some_total_us,
        pressure_full_total_us: p.full_total_us,
        pressure_some_avg: p.some_avg,
        pressure_full_avg: p.full_avg,
        guest_reset: vm.ppa_page().map_or(0, |page| page.board().reset_asked()),
        ..HostVm::default()
    }
}

/// Most guest alarms taken from the ring per refresh (8 ms): a guest that floods its ring
/// costs the VMM at most this many record reads and events per refresh, ~4,000 a second;
/// the rest are counted as lost.
pub const ALARMS_PER_REFRESH: usize = 32;

/// Takes the guest agent's new alarms from its ring into the board and the event hub.
fn guest_alarms(vm: &VmHandle, reader: &mut AlarmReader, hub: &EventHub) {
    let Some(page) = vm.ppa_page() else {
        return;
    };
    let p = reader.poll(&page.guest_section(), ALARMS_PER_REFRESH);
    if let Some(why) = &p.problem {
        log::warn!("guest alarms: {why}; they are not forwarded until the ring is readable");
    }
    if p.alarms.is_empty() && p.lost == 0 && p.invalid == 0 {
        return;
    }
    let uptime_ns = vm.uptime_ns();
    for a in &p.alarms {
        hub.push(Event::GuestAlarm {
            uptime_ns,
            alarm: a.clone(),
        });
    }
    page.board().record(&p);
}

/// Longest interval between refreshes of a quiet VM without a PPA page (see
/// [`refresh_step`]).
pub const QUIET_REFRESH_NS: u64 = 128_000_000;

/// The interval to the next refresh after one that found the VM's vCPUs busy for `busy_ns`
/// (on a CPU, waiting for one, or held by a limit, summed) over `tick_ns`: [`PAGE_REFRESH_NS`]
/// while the VM does anything or has a PPA page (whose host records the ABI promises at most
/// 10 ms old); doubling from `step_ns` up to [`QUIET_REFRESH_NS`] while the vCPUs were busy for
/// less than 1 % of the tick between them. Why: 200 idle VMMs, each refreshing every 8 ms, kept
/// the development host's two CPUs busy (docs/operations.md, "200 VMs on one host"). A quiet
/// tick has no stall to place, so its pressure is exact whatever its length; the first tick
/// after the VM wakes up is up to 128 ms long, and where more than one vCPU then stalls, its
/// some/full overlap is estimated over that tick (docs/accounting.md, pressure).
pub fn refresh_step(step_ns: u64, busy_ns: u64, tick_ns: u64, page: bool) -> u64 {
    if page || busy_ns.saturating_mul(100) >= tick_ns {
        PAGE_REFRESH_NS
    } else {
        step_ns
            .saturating_mul(2)
            .clamp(PAGE_REFRESH_NS, QUIET_REFRESH_NS)
    }
}

/// The vCPUs' time on a CPU, waiting for one and held by limits, summed (ns).
fn busy_ns(summaries: &[Option<VcpuSummary>]) -> u64 {
    summaries
        .iter()
        .flatten()
        .map(|t| t.used_ns + t.steal_ns + t.limited_ns)
        .sum()
}

/// For each vCPU (thread ids `tids`, 0 before its thread starts), the instants the kernel
/// picked its thread (`pressure::timeline::picked_at`): the `handoffs` (when, next thread) of
/// this look's records that name it, and the latest of earlier looks (`last`, updated here),
/// which a wait that began before this window and ends in it needs. Handoffs to threads that
/// are not this VM's vCPUs are left out.
fn picks(
    tids: &[i32],
    handoffs: impl Iterator<Item = (u64, u32)>,
    last: &mut [u64],
) -> Vec<Vec<u64>> {
    let mut picked: Vec<Vec<u64>> = last
        .iter()
        .map(|&l| if l == 0 { Vec::new() } else { vec![l] })
        .collect();
    for (time, next) in handoffs {
        if let Some(i) = tids.iter().position(|&t| t > 0 && t as u32 == next) {
            picked[i].push(time);
            last[i] = last[i].max(time);
        }
    }
    picked
}

/// What the refreshes keep between them.
struct Refresh {
    tracker: Tracker,
    /// One per vCPU: its state intervals for exact pressure.
    readers: Vec<VcpuReader>,
    /// One per vCPU: the latest instant another vCPU's handoff picked it ([`picks`]).
    last_pick: Vec<u64>,
    /// A vCPU thread asleep inside KVM_RUN is halted (see [`Sampler::start`]).
    halts: bool,
    count: u64,
    slow: Slow,
    /// [`busy_ns`] at the latest refresh, and when it was.
    busy: (u64, u64),
    /// The interval to the next refresh ([`refresh_step`]).
    step_ns: u64,
    /// The latest refresh's summaries and when they were read (what runaway detection
    /// judges).
    latest: (u64, Vec<Option<VcpuSummary>>),
    /// The place in the guest agent's alarm ring, and where alarms go.
    alarms: AlarmReader,
    hub: Arc<EventHub>,
}

/// One refresh: the summaries, the pressure tick, the page (through its writer, when the
/// VM has a page), and the interval to the next one.
fn refresh(vm: &VmHandle, r: &mut Refresh, page: Option<&mut HostWriter<'_>>, now: u64) {
    let vcpus = vm.vcpus();
    let s = summaries(vcpus);
    let busy = busy_ns(&s);
    r.step_ns = refresh_step(
        r.step_ns,
        busy.saturating_sub(r.busy.0),
        now.saturating_sub(r.busy.1),
        page.is_some(),
    );
    r.busy = (busy, now);
    let uptime = vm.uptime_ns();
    // A vCPU whose thread ended has no time in the tick.
    let live: Vec<Option<&VcpuSummary>> = s
        .iter()
        .zip(vcpus)
        .map(|(t, v)| t.as_ref().filter(|_| v.acct.finals.get().is_none()))
        .collect();
    let from = r.tracker.window_start();
    let gathered: Vec<Option<Gathered>> = vcpus
        .iter()
        .zip(r.readers.iter_mut())
        .zip(&live)
        .map(|((v, reader), l)| match l {
            Some(_) => {
                let started = v.acct.started_ns.load(Ordering::Acquire);
                reader.gather(&v.acct.meter, started, (from, now)).ok()
            }
            None => {
                *reader = VcpuReader::default();
                None
            }
        })
        .collect();
    let tids: Vec<i32> = vcpus.iter().map(|v| v.host_tid()).collect();
    let handoffs = gathered.iter().flatten().flat_map(Gathered::handoffs);
    let picked = picks(&tids, handoffs, &mut r.last_pick);
    let timelines: Vec<Option<Vec<Seg>>> = gathered
        .iter()
        .zip(&picked)
        .map(|(g, p)| g.as_ref().map(|g| g.segments(p, r.halts, from, now)))
        .collect();
    let known: Vec<Option<&[Seg]>> = timelines.iter().map(Option::as_deref).collect();
    r.tracker.tick(now, live, &known);
    r.tracker.post(vm.pressure(), now, uptime);
    if let Some(page) = page {
        if r.count % SERVICE_CPU_EVERY == 0 {
            r.slow = Slow::read(vm);
        }
        r.count += 1;
        publish(page, uptime, &s);
        page.publish_vm(&vm_record(vm, uptime, &s, &r.slow));
        guest_alarms(vm, &mut r.alarms, &r.hub);
    }
    r.latest = (now, s);
}

fn run(
    vm: &VmHandle,
    control: &AccountingControl,
    stop: &(AtomicBool, AtomicU32),
    overload: Option<Overload>,
    (halts, hub): (bool, Arc<EventHub>),
) {
    crate::seccomp::enter(crate::seccomp::Kind::Sampler);
    let vcpus = vm.vcpus();
    let groups = vm
        .limiter()
        .groups()
        .into_iter()
        .filter(|g| g.name != "vm")
        .map(|g| (g.name, g.vcpus))
        .collect();
    let mut refresher = Refresh {
        tracker: Tracker::new(vcpus.len(), groups, now_ns()),
        readers: (0..vcpus.len()).map(|_| VcpuReader::default()).collect(),
        last_pick: vec![0; vcpus.len()],
        halts,
        latest: (0, Vec::new()),
        alarms: AlarmReader::default(),
        hub,
        count: 0,
        slow: Slow::default(),
        busy: (0, now_ns()),
        step_ns: PAGE_REFRESH_NS,
    };
    // The page's one writer, held for the whole run.
    let mut page = vm.ppa_page().and_then(PpaPage::host_writer);
    let mut detectors = vec![Detectors::default(); vcpus.len()];
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
        let wake = next.min(next_page);
        if now < wake {
            futex_wait(&stop.1, seen, Some(wake));
            continue;
        }
        if now >= next_page {
            refresh(vm, &mut refresher, page.as_mut(), now);
            let step = refresher.step_ns;
            next_page = (next_page + step).max(now + step / 2);
            // A quiet VM's refresh moves to the steal window's wake-up when that is near (the
            // windows' own deadline never moves).
            if step > PAGE_REFRESH_NS && next.abs_diff(next_page) < step / 2 {
                next_page = next.max(now + PAGE_REFRESH_NS);
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
            let (at, latest) = &refresher.latest;
            o.check(vcpus, &mut detectors, (*at, latest), window);
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

mod runaway;

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn handoffs_pick_the_vcpus_they_name_and_the_latest_is_kept_for_the_next_look() {
        let tids = [100, 0, 102];
        let mut last = vec![0, 0, 5];
        let got = picks(
            &tids,
            [(10, 102), (20, 100), (30, 999), (40, 0), (50, 102)].into_iter(),
            &mut last,
        );
        // vCPU 1 has no thread yet (tid 0), and 999 is not a vCPU: both are left out.
        assert_eq!(got, vec![vec![20], vec![], vec![5, 10, 50]]);
        assert_eq!(last, vec![20, 0, 50]);
        // The next look, with no handoff: the latest picks are still there.
        let got = picks(&tids, std::iter::empty(), &mut last);
        assert_eq!(got, vec![vec![20], vec![], vec![50]]);
    }

    #[test]
    fn a_quiet_vm_is_refreshed_less_often_and_a_busy_one_or_a_page_every_8_ms() {
        const MS: u64 = 1_000_000;
        // Quiet (under 1 % of the tick): the interval doubles up to the cap.
        assert_eq!(refresh_step(PAGE_REFRESH_NS, 0, 8 * MS, false), 16 * MS);
        assert_eq!(refresh_step(16 * MS, 159_000, 16 * MS, false), 32 * MS);
        assert_eq!(
            refresh_step(QUIET_REFRESH_NS, 0, 128 * MS, false),
            QUIET_REFRESH_NS
        );
        // Busy for 1 % of the tick or more: back to 8 ms at once.
        assert_eq!(
            refresh_step(QUIET_REFRESH_NS, 1_280_000, 128 * MS, false),
            PAGE_REFRESH_NS
        );
        // A PPA page's host records are due every 8 ms, quiet or not.
        assert_eq!(
            refresh_step(PAGE_REFRESH_NS, 0, 8 * MS, true),
            PAGE_REFRESH_NS
        );
        // A tick of no length (two refreshes at one instant) is not quiet.
        assert_eq!(refresh_step(64 * MS, 0, 0, false), PAGE_REFRESH_NS);
    }

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
