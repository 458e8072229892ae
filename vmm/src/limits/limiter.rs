//! The `limiter` thread: enforces every CPU limit of a VM (the VM-wide one and each vCPU
//! group's) in the VMM, with the thread CPU clocks and high-resolution sleeps.
//!
//! Data flow: at each look the thread reads every member's CPU clock (the exact CPU time of
//! its thread, ~0.7 µs a read) and micro-state, asks [`engine::decide`] which members must
//! stop, kicks those out of KVM_RUN with a limit request bit (the vCPU parks as `limited`
//! until the bit is cleared) and releases those the decision lets go. It then sleeps until
//! the earliest next look or period boundary of any limit (a futex wait with an absolute
//! CLOCK_MONOTONIC deadline: an hrtimer, not a tick). At a period boundary it closes the
//! period (used, overshoot), releases every member and starts the next one. Changes from the
//! socket wait in [`Limiter`] and apply at the limit's next boundary. The thread asks for
//! SCHED_FIFO priority 1 (its looks are few and short, and a late look is overshoot); without
//! the privilege it runs at nice -10 and says so. Readers get each limit's figures from
//! [`Limiter::groups`]; vCPU threads never wait on this thread.
//!
//! With kick timers (`--limit-kick timer`, the default) the thread also publishes, at each
//! look, every running member's deadline: the CPU it may still use (its runway), which the
//! member's own timer is armed for (`vcpu::kick_timer`). The member then stops itself on
//! time however late this thread wakes; the thread adopts such a stop at its next look (the
//! request bit, the figures, the event), and its own look for that member comes
//! [`FALLBACK_NS`] after the deadline, to kick a member whose timer was late. Members without
//! a timer are looked at and kicked as before.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use ppa_vmm_api::{
    Event, GroupStats, LimitBackend, LimitKick, LimitKicks, LimitStops, ThrottleEndWhy,
};

use super::cgroup::{CgroupError, CgroupLimits};
use super::engine::{decide, next_look_ns, Decision, Member};
use super::margin::StopMargin;
use super::member_kicks::{stages_since, MemberKicks};
use super::{check_name, KickMode, Limit, LimitError, Scope, VM_GROUP};
use crate::accounting::histogram::{Histogram, HistogramSnapshot};
use crate::accounting::meter::{MicroState, ParkKind};
use crate::event_hub::EventHub;
use crate::sync::{futex_wait, futex_wake, now_ns};
use crate::vcpu::stops::StopTotals;
use crate::vcpu::{LimitKind, ThreadState, TimerMode, VcpuShared};

// Declared in `limits` (so that `cgroup` need not import this module); re-exported for the
// callers that name them here.
pub use super::{Backend, LimitConfig};

/// Per-period CPU use kept per limit once [`Limiter::keep_period_log`] asked for it (`bench
/// limit`): the first periods, at most this many.
const PERIOD_LOG: usize = 100_000;

/// With kick timers, how long after a member's deadline the thread looks at it: time for its
/// timer to fire and stop it, after which the thread kicks it (the fallback).
pub const FALLBACK_NS: u64 = 100_000;

/// With kick timers, the earliest the thread looks for a member's fallback alone: its own
/// timer stops it (p99 lateness ~60 µs, max ~130 µs measured here), so an earlier look only
/// adopts that stop sooner. Without the floor, 64 members waiting their turn on 2 host CPUs
/// had the thread look every few hundred µs at members that were not running (docs/limits.md).
pub const FALLBACK_LOOK_MIN_NS: u64 = 1_000_000;

/// A limit's state, kept by the thread.
struct Entity {
    name: String,
    members: Vec<usize>,
    kind: LimitKind,
    limit: Option<(Limit, String)>,
    /// A change waiting for the next boundary (`Some(None)`: remove the limit).
    pending: Option<Option<(Limit, String)>>,
    period_start: u64,
    /// Members' CPU time at the period start (`None`: the thread had not started; it is set
    /// when it has, so nothing before a vCPU's start is charged to a period).
    base_cpu: Vec<Option<u64>>,
    stopped: Vec<bool>,
    stopped_this_period: bool,
    periods: u64,
    /// Length of the completed periods, summed.
    periods_ns: u64,
    throttled_periods: u64,
    used_ns: u64,
    overshoot: Histogram,
    overshoot_max: u64,
    /// Members' limited time when the limit was set.
    limited_base: Vec<u64>,
    next_look: Option<u64>,
    /// CPU time used in each closed period, most recent last; kept only while
    /// [`Limiter::keep_period_log`] asks for it (a VM that runs for days must not grow it).
    log: Vec<u64>,
    /// The stop margin, learnt ([`StopMargin`]: the median of the last periods' stop
    /// latencies); `None` until the first look gives it the limiter's estimate.
    margin: Option<StopMargin>,
    /// Members stopped in the period in progress.
    stops_this_period: u64,
    /// What each member is expected to want this period: its use in the previous period,
    /// with 10 % headroom, or at least an equal share if it was stopped then (its use then
    /// understates what it wanted).
    last_used: Vec<u64>,
    /// Members stopped at some time in the period in progress.
    was_stopped: Vec<bool>,
    /// Stops by this thread's kick since the limit was set.
    limiter_kicks: u64,
    /// Members' kick-timer readings for this limit when it was set.
    timer_base: Vec<MemberKicks>,
    /// Members' stops' totals at the period start, and what the completed periods' stops
    /// cost (not charged: `vcpu::stops`).
    base_stops: Vec<StopTotals>,
    stops: LimitStops,
    /// When the limit was set: 0 for a limit of the VM's config, whose first period begins
    /// when its first member starts (`periods`).
    set_at: u64,
    /// Scope `vm`: the device threads' account (`devices`).
    dev: devices::DeviceCharge,
    /// Every member finished and the last period was closed at the last one's end.
    ended: bool,
    /// Turns (`turns`): who waits its turn this period, how many may run, who wanted CPU at
    /// its start, what each is owed, whether this period has turns, and how many had.
    benched: Vec<bool>,
    runners: usize,
    turn_demand: Vec<bool>,
    owed: Vec<i64>,
    turns_this_period: bool,
    turn_periods: u64,
    /// A turn that straddles the period's end (`turns`).
    straddle: turns::Straddle,
}

/// What the socket and the report share with the thread.
pub struct Limiter {
    entities: Mutex<Vec<Entity>>,
    wake: AtomicU32,
    stop: AtomicBool,
    vcpus: Vec<Arc<VcpuShared>>,
    hub: Option<Arc<EventHub>>,
    start_ns: u64,
    margin_ns: u64,
    cgroup: Option<CgroupLimits>,
    /// Members stop by their kick timers (VMM backend, `--limit-kick timer`).
    timers: bool,
    /// Host CPUs the vCPU threads may run on: how many members can use CPU at once.
    host_cpus: usize,
    /// Lateness of the looks the thread planned: woken at its deadline, how long after it.
    look_lateness: Histogram,
    /// Keep each limit's per-period use (`bench limit`); off otherwise.
    keep_log: AtomicBool,
    /// The VM's devices with threads (a limit of scope `vm` charges and holds them).
    devices: std::sync::OnceLock<Vec<Arc<dyn crate::devices::Device>>>,
}

fn limited_total(v: &VcpuShared, now: u64) -> u64 {
    let m = v.acct.meter.read();
    let mut t = m.blocked[ParkKind::Limited];
    if m.micro_state() == MicroState::Limited && m.since != 0 {
        t += now.saturating_sub(m.since);
    }
    t
}

/// When the run loop of `v` ended (`None` while it runs): a member is done for its limits
/// there, not when its thread has torn down (at level full that took ~0.5 s here, which a
/// 4-vCPU limit counted as 53 periods of nothing: charged 91 % of its quota).
fn ended_at(v: &VcpuShared) -> Option<u64> {
    match v.acct.ended_ns.load(Ordering::Acquire) {
        0 if v.state() == ThreadState::Finished => Some(v.acct.finals.get().map_or(0, |f| f.at_ns)),
        0 => None,
        t => Some(t),
    }
}

/// The CPU clock a limit charges `v` by (its thread's, less its stops: `vcpu::stops`).
fn cpu_of(v: &VcpuShared) -> Option<u64> {
    v.charged_cpu_ns().map(|(c, _)| c)
}

/// Charged CPU time since `base`. A thread that started during the period is charged from
/// its start (the CPU time when its wall clock started, before any stop), not from when the
/// limiter first saw it.
fn used_since(v: &VcpuShared, base: &mut Option<u64>) -> u64 {
    if base.is_none() {
        *base = v.acct.origin_cpu_ns();
    }
    match (cpu_of(v), *base) {
        (Some(now), Some(b)) => now.saturating_sub(b),
        _ => 0,
    }
}

/// The stops' totals of `v` now (zero before its thread started).
fn stops_of(v: &VcpuShared) -> StopTotals {
    v.charged_cpu_ns().map(|(_, t)| t).unwrap_or_default()
}

impl Entity {
    fn new(
        name: String,
        members: Vec<usize>,
        kind: LimitKind,
        limit: Option<(Limit, String)>,
    ) -> Self {
        let n = members.len();
        Entity {
            name,
            members,
            kind,
            limit,
            pending: None,
            period_start: 0,
            base_cpu: vec![None; n],
            stopped: vec![false; n],
            stopped_this_period: false,
            periods: 0,
            periods_ns: 0,
            throttled_periods: 0,
            used_ns: 0,
            overshoot: Histogram::new(3).expect("3 fractional bits are valid"),
            overshoot_max: 0,
            limited_base: vec![0; n],
            next_look: None,
            log: Vec::new(),
            margin: None,
            stops_this_period: 0,
            last_used: vec![0; n],
            was_stopped: vec![false; n],
            limiter_kicks: 0,
            timer_base: vec![MemberKicks::zero(); n],
            base_stops: vec![StopTotals::default(); n],
            stops: LimitStops::default(),
            set_at: 0,
            ended: false,
            dev: Default::default(),
            benched: vec![false; n],
            runners: n,
            turn_demand: vec![false; n],
            owed: vec![0; n],
            turns_this_period: false,
            turn_periods: 0,
            straddle: turns::Straddle::new(n),
        }
    }

    /// Members' kick-timer readings for this limit now.
    fn timer_counts(&self, vcpus: &[Arc<VcpuShared>]) -> Vec<MemberKicks> {
        let read = |&i: &usize| MemberKicks::read(&vcpus[i], self.kind);
        self.members.iter().map(read).collect()
    }

    fn kicks(&self, vcpus: &[Arc<VcpuShared>], timers: bool) -> LimitKicks {
        let now = self.timer_counts(vcpus);
        let since = |f: fn(&MemberKicks) -> u64| -> u64 {
            now.iter()
                .zip(&self.timer_base)
                .map(|(n, b)| f(n).saturating_sub(f(b)))
                .sum()
        };
        let all_timed = self.members.iter().all(|&i| {
            !matches!(
                vcpus[i].kick_timer.mode(),
                TimerMode::Off | TimerMode::Failed
            )
        });
        LimitKicks {
            path: if timers && all_timed {
                LimitKick::Timer
            } else {
                LimitKick::Limiter
            },
            timer: since(|c| c.stops),
            rearms: since(|c| c.rearms),
            limiter: self.limiter_kicks,
            stages: Some(stages_since(&now, &self.timer_base)),
        }
    }

    fn figures(
        &self,
        vcpus: &[Arc<VcpuShared>],
        now: u64,
        timers: bool,
        devices: (u64, u64, u64),
    ) -> GroupStats {
        let (quota_ns, period_ns) = self
            .limit
            .as_ref()
            .map_or((0, 0), |(l, _)| (l.quota_ns, l.period_ns));
        let limited_ns = self
            .members
            .iter()
            .zip(&self.limited_base)
            .map(|(&i, b)| limited_total(&vcpus[i], now).saturating_sub(*b))
            .sum();
        GroupStats {
            name: self.name.clone(),
            vcpus: self.members.clone(),
            backend: LimitBackend::Vmm,
            limit: self
                .limit
                .as_ref()
                .map_or("none".to_string(), |(_, g)| g.clone()),
            quota_ns,
            period_ns,
            periods: self.periods,
            periods_ns: self.periods_ns,
            throttled_periods: self.throttled_periods,
            used_ns: self.used_ns,
            stops: self.stops.clone(),
            scope: scope_of(self),
            devices_ns: devices.0,
            devices_limited_ns: devices.1,
            device_holds: devices.2,
            limited_ns,
            turn_periods: self.turn_periods,
            straddled_periods: self.straddle.periods,
            overshoot_max_ns: self.overshoot_max,
            overshoot: self.overshoot.snapshot().to_json(),
            kicks: self.kicks(vcpus, timers),
        }
    }
}

impl Limiter {
    /// The limiter of a VM with `vcpus`, starting with `config`; `margin_ns` is how much CPU
    /// a member may still use between the decision to stop it and its stop (about one exit).
    pub fn new(
        config: &LimitConfig,
        vcpus: Vec<Arc<VcpuShared>>,
        hub: Option<Arc<EventHub>>,
        margin_ns: u64,
    ) -> Self {
        Self::with_cgroup(config, vcpus, hub, margin_ns, None)
    }

    /// The same, with the limits enforced by `cgroup` instead (the VMM then enforces none).
    pub fn with_cgroup(
        config: &LimitConfig,
        vcpus: Vec<Arc<VcpuShared>>,
        hub: Option<Arc<EventHub>>,
        margin_ns: u64,
        cgroup: Option<CgroupLimits>,
    ) -> Self {
        let mut entities = Vec::new();
        let config = if cgroup.is_some() {
            &LimitConfig::default()
        } else {
            config
        };
        let timers = cgroup.is_none() && config.kick == KickMode::Timer;
        for v in &vcpus {
            v.kick_timer.set_wanted(timers);
        }
        let all: Vec<usize> = (0..vcpus.len()).collect();
        if let Some(vm) = &config.vm {
            entities.push(Entity::new(
                VM_GROUP.into(),
                all,
                LimitKind::Vm,
                Some(vm.clone()),
            ));
        }
        for g in &config.groups {
            entities.push(Entity::new(
                g.name.clone(),
                g.vcpus.clone(),
                LimitKind::Group,
                Some((g.limit, g.given.clone())),
            ));
        }
        Limiter {
            entities: Mutex::new(entities),
            wake: AtomicU32::new(0),
            stop: AtomicBool::new(false),
            vcpus,
            hub,
            start_ns: now_ns(),
            margin_ns,
            cgroup,
            timers,
            // The vCPU threads inherit the affinity of the thread that builds the VM.
            host_cpus: crate::sched::allowed_cpus().len(),
            look_lateness: Histogram::new(3).expect("3 fractional bits are valid"),
            keep_log: AtomicBool::new(false),
            devices: std::sync::OnceLock::new(),
        }
    }

    /// How late the thread's planned looks were (woken at a deadline: how long after it).
    pub fn look_lateness(&self) -> HistogramSnapshot {
        self.look_lateness.snapshot()
    }

    /// The cgroups, with the cgroup backend.
    pub fn cgroup(&self) -> Option<&CgroupLimits> {
        self.cgroup.as_ref()
    }

    /// With the cgroup backend: waits (at most 5 s) until every vCPU thread has its id, and
    /// places each in its cgroup, the device threads (`devices`) and the others (`service`)
    /// in theirs. Call before the vCPUs are released.
    pub fn place_threads(&self, devices: &[i32], service: &[i32]) -> Result<(), CgroupError> {
        let Some(cg) = &self.cgroup else {
            return Ok(());
        };
        let deadline = now_ns() + 5_000_000_000;
        let tids = loop {
            let tids: Vec<i32> = self.vcpus.iter().map(|v| v.host_tid()).collect();
            if tids.iter().all(|t| *t != 0) {
                break tids;
            }
            if now_ns() > deadline {
                return Err(CgroupError::ThreadsLate { secs: 5 });
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        cg.place(&tids, devices, service)
    }

    /// Keeps each limit's per-period use from now on, for [`Limiter::period_log`] (`bench
    /// limit`; off by default, so that a long run does not grow a log nobody reads).
    pub fn keep_period_log(&self) {
        self.keep_log.store(true, Ordering::Relaxed);
    }

    /// CPU time used in each closed period of limit `name`, oldest first (VMM backend), since
    /// [`Limiter::keep_period_log`].
    pub fn period_log(&self, name: &str) -> Vec<u64> {
        self.lock()
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.log.clone())
            .unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entity>> {
        self.entities.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every limit's figures now.
    pub fn groups(&self) -> Vec<GroupStats> {
        if let Some(cg) = &self.cgroup {
            return cg.groups(|i| {
                let v = &self.vcpus[i].acct;
                v.thread_cpu_ns()
                    .unwrap_or(0)
                    .saturating_sub(v.origin_cpu_ns().unwrap_or(0))
            });
        }
        let now = now_ns();
        self.lock()
            .iter()
            .map(|e| e.figures(&self.vcpus, now, self.timers, self.devices_figures(e)))
            .collect()
    }

    /// Sets, changes or removes (`none`) the limit of `group` (`vm`: the VM-wide one). A
    /// change applies at the limit's next period boundary; a new limit at once.
    pub fn set_limit(&self, group: &str, limit: &str) -> Result<(), LimitError> {
        if self.cgroup.is_some() {
            return Err(LimitError::Backend);
        }
        let new = match limit.trim() {
            "none" | "off" => None,
            text if group == VM_GROUP => {
                let (l, _) = super::parse_vm_limit(text)?;
                Some((l, text.to_string()))
            }
            text if text.contains(',') => return Err(LimitError::Scope(text.to_string())),
            text => {
                let l = Limit::parse(text)?;
                Some((l, text.to_string()))
            }
        };
        let mut entities = self.lock();
        match entities.iter_mut().find(|e| e.name == group) {
            Some(e) => {
                if let Some((l, text)) = &new {
                    l.check_members(text, e.members.len())?;
                }
                if e.limit.is_none() {
                    e.limit = new;
                    e.period_start = 0;
                    let now = now_ns();
                    e.set_at = now;
                    for (k, &i) in e.members.iter().enumerate() {
                        e.limited_base[k] = limited_total(&self.vcpus[i], now);
                    }
                } else {
                    e.pending = Some(new);
                }
            }
            None if group == VM_GROUP => {
                let all: Vec<usize> = (0..self.vcpus.len()).collect();
                if let Some((l, text)) = &new {
                    l.check_members(text, all.len())?;
                }
                let mut e = Entity::new(VM_GROUP.into(), all, LimitKind::Vm, new);
                let now = now_ns();
                e.set_at = now;
                for (k, &i) in e.members.iter().enumerate() {
                    e.limited_base[k] = limited_total(&self.vcpus[i], now);
                }
                entities.insert(0, e);
            }
            None => {
                check_name(group)?;
                return Err(LimitError::NoSuchGroup(group.to_string()));
            }
        }
        drop(entities);
        self.wake.fetch_add(1, Ordering::Release);
        futex_wake(&self.wake);
        Ok(())
    }

    /// Holds vCPU `vcpu` to `limit` from now on, as its own limit `runaway-N` (runaway
    /// detection's throttle action). Does nothing if it already has one.
    pub fn throttle_vcpu(&self, vcpu: usize, limit: Limit, given: &str) {
        if vcpu >= self.vcpus.len() {
            return;
        }
        let name = format!("runaway-{vcpu}");
        let mut entities = self.lock();
        if entities.iter().any(|e| e.name == name) {
            return;
        }
        let mut e = Entity::new(
            name,
            vec![vcpu],
            LimitKind::Runaway,
            Some((limit, given.to_string())),
        );
        e.set_at = now_ns();
        e.limited_base[0] = limited_total(&self.vcpus[vcpu], e.set_at);
        entities.push(e);
        drop(entities);
        self.wake.fetch_add(1, Ordering::Release);
        futex_wake(&self.wake);
    }

    /// Ends the thread's loop (it releases every member it stopped).
    pub fn stop(&self) {
        self.hold_devices(false);
        self.stop.store(true, Ordering::Release);
        self.wake.fetch_add(1, Ordering::Release);
        futex_wake(&self.wake);
    }

    fn event(&self, e: Event) {
        if let Some(h) = &self.hub {
            h.push(e);
        }
    }

    fn uptime(&self, now: u64) -> u64 {
        now.saturating_sub(self.start_ns)
    }

    /// Starts a period at `now`: baselines, and every member released but those that wait
    /// their turn (`turns`), which stay stopped.
    fn begin_period(&self, e: &mut Entity, now: u64, why: ThrottleEndWhy) {
        let mut was_stopped = e.stopped.iter().any(|s| *s);
        if scope_of(e) == Scope::Vm {
            self.devices_begin(e);
        }
        self.plan_turns(e, now);
        for (k, &i) in e.members.iter().enumerate() {
            // A turn that straddled the boundary: charged from its use before it.
            e.base_cpu[k] = e.straddle.take_carry(k).or_else(|| cpu_of(&self.vcpus[i]));
            e.base_stops[k] = stops_of(&self.vcpus[i]);
            if e.benched[k] {
                // Waits its turn: a hold of its timer becomes this limit's stop; one still
                // running is kicked by the look that follows.
                if !e.stopped[k] && self.vcpus[i].kick_held(e.kind) {
                    self.vcpus[i].adopt_kick_hold(e.kind);
                    e.stopped[k] = true;
                }
                continue;
            }
            if e.stopped[k] {
                self.vcpus[i].release(e.kind.into());
                e.stopped[k] = false;
            }
            // A member its timer stopped that no look has adopted yet.
            was_stopped |= self.vcpus[i].release_kick_hold(e.kind);
        }
        // Members waiting their turn are still stopped: the throttling goes on.
        if was_stopped && !e.stopped.iter().any(|s| *s) {
            self.event(Event::ThrottleEnd {
                uptime_ns: self.uptime(now),
                group: e.name.clone(),
                why,
            });
        }
        e.period_start = now;
        e.stopped_this_period = e.turns_this_period;
        e.stops_this_period = 0;
        e.was_stopped.clone_from(&e.benched);
        e.next_look = Some(now);
    }

    /// One look at one limit.
    fn look(&self, e: &mut Entity, now: u64) {
        if e.limit.is_none() {
            // No limit: release whoever is still stopped, and no deadline for the timers.
            if e.stopped.iter().any(|s| *s) {
                self.begin_period(e, now, ThrottleEndWhy::Period);
            }
            self.clear_deadlines(e);
            e.next_look = None;
            return;
        }
        if e.ended || self.close_at_end(e) {
            return;
        }
        if e.period_start == 0 && !self.first_period(e, now) {
            return;
        }
        self.adopt_holds(e, now);
        let period = e.limit.as_ref().map_or(0, |(l, _)| l.period_ns);
        let boundary = e.period_start + period;
        if now >= boundary {
            self.end_period(e, boundary, now);
        }
        let Some((l, _)) = e.limit.clone() else {
            // Removed at this boundary: the old period's deadlines must not fire a hold that
            // no later look would end (the thread sleeps without a deadline from here).
            self.clear_deadlines(e);
            e.next_look = None;
            return;
        };
        let (mut members, cpu) = self.read_members(e);
        self.release_straddle(e, &mut members, now);
        self.hand_over_turns(e, &mut members);
        let margin_ns = e
            .margin
            .get_or_insert(StopMargin::new(self.margin_ns))
            .get();
        let (budget, for_devices) = if scope_of(e) == Scope::Vm {
            self.devices_budget(e, &members, &l, margin_ns, now)
        } else {
            let end = e.period_start + l.period_ns;
            (Self::straddle_budget(e, l.quota_ns, end), None)
        };
        let d = decide(budget, &members, margin_ns, self.host_cpus);
        self.apply_stops(e, &d, &members, l.quota_ns, now);
        let timed = self.publish_deadlines(e, &d, &cpu, now);
        let period_end = e.period_start + l.period_ns;
        let next = match (next_look_ns(&d, &timed), for_devices) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut next_look = next.map_or(period_end, |r| (now + r).min(period_end));
        if let Some(r) = e.straddle.release_due() {
            next_look = next_look.min(r.max(now));
        }
        if self.members_to_start(e) {
            // A member yet to start runs, once it does, with no deadline and no share until
            // a look sees it: look again soon.
            next_look = next_look.min(now + periods::START_POLL_NS);
        }
        e.next_look = Some(next_look);
    }

    /// What the engine is given of each member of `e` now, and each member's CPU clock as read
    /// now (for its timer's deadline; None where its clock cannot be read).
    fn read_members(&self, e: &mut Entity) -> (Vec<Member>, Vec<Option<u64>>) {
        let mut members = Vec::with_capacity(e.members.len());
        let mut cpu = Vec::with_capacity(e.members.len());
        for (k, &i) in e.members.iter().enumerate() {
            let v = &self.vcpus[i];
            let used_ns = used_since(v, &mut e.base_cpu[k]);
            cpu.push(e.base_cpu[k].map(|b| b + used_ns));
            members.push(Member {
                used_ns,
                demanding: self.wants_cpu(e, k),
                stopped: e.stopped[k],
                can_run: ended_at(v).is_none(),
                expected_ns: e.last_used[k],
                benched: e.benched[k],
            });
        }
        (members, cpu)
    }

    /// Carries out decision `d` on the `members` it was made for under `quota_ns`: kicks
    /// those it newly stops, releases those it no longer stops, and says so in events.
    fn apply_stops(
        &self,
        e: &mut Entity,
        d: &Decision,
        members: &[Member],
        quota_ns: u64,
        now: u64,
    ) {
        let mut newly = Vec::new();
        let mut released = false;
        for (k, &i) in e.members.iter().enumerate() {
            match (e.stopped[k], d.stop[k]) {
                (false, true) => {
                    // This thread's kick: every stop without a timer, else the fallback.
                    self.vcpus[i].kick(e.kind.into());
                    self.vcpus[i].set_kick_deadline(e.kind, None);
                    e.limiter_kicks += 1;
                    e.stopped[k] = true;
                    e.was_stopped[k] = true;
                    e.stops_this_period += 1;
                    newly.push(i);
                }
                (true, false) => {
                    self.vcpus[i].release(e.kind.into());
                    e.stopped[k] = false;
                    released = true;
                }
                _ => {}
            }
        }
        if !newly.is_empty() {
            e.stopped_this_period = true;
            self.event(Event::ThrottleStart {
                uptime_ns: self.uptime(now),
                group: e.name.clone(),
                vcpus: newly,
                used_ns: members.iter().map(|m| m.used_ns).sum(),
                quota_ns,
            });
        }
        if released && !e.stopped.iter().any(|s| *s) {
            self.event(Event::ThrottleEnd {
                uptime_ns: self.uptime(now),
                group: e.name.clone(),
                why: ThrottleEndWhy::Redistributed,
            });
        }
    }

    /// The thread's loop; returns after [`Limiter::stop`], with every member released.
    pub fn run(&self) {
        crate::sched::raise_realtime("limiter", crate::sched::LIMITER_RT_PRIORITY);
        crate::seccomp::enter(crate::seccomp::Kind::Limiter);
        let mut planned: Option<u64> = None;
        loop {
            let seen = self.wake.load(Ordering::Acquire);
            if self.stop.load(Ordering::Acquire) {
                let mut entities = self.lock();
                for e in entities.iter_mut() {
                    self.clear_deadlines(e);
                    for (k, &i) in e.members.iter().enumerate() {
                        if e.stopped[k] {
                            self.vcpus[i].release(e.kind.into());
                            e.stopped[k] = false;
                        }
                    }
                }
                return;
            }
            let now = now_ns();
            if let Some(p) = planned.take() {
                // Woken at (or after) the deadline it slept for, not by a change.
                if now >= p {
                    self.look_lateness.record(now - p);
                }
            }
            let mut next: Option<u64> = None;
            {
                let mut entities = self.lock();
                for e in entities.iter_mut() {
                    if e.next_look.is_none_or(|t| t <= now) || e.period_start == 0 {
                        self.look(e, now);
                    }
                    if let Some(t) = e.next_look {
                        next = Some(next.map_or(t, |n: u64| n.min(t)));
                    }
                }
            }
            planned = next;
            futex_wait(&self.wake, seen, next);
        }
    }
}

mod devices;
use devices::scope_of;
mod periods;
#[cfg(test)]
mod tests;
mod timers;
mod turns;
