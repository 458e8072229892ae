//! Token-bucket rate limiters of a device's I/O (docs/limits.md "Rate limiters"): the
//! `rate=` value of `--net` and `--disk`, the buckets, and the clock of a queue's throttled
//! time.
//!
//! Semantics are Firecracker's and Cloud Hypervisor's: a bucket of `size` tokens (bytes, or
//! operations: frames, requests) refills at `size` per refill time, starts full, and may
//! carry a one-time burst spent before its budget. What differs, and why
//! (docs/limits.md): a throttled queue waits exactly until the bucket holds what the next
//! frame or request needs (at least [`MIN_WAIT_NS`]), where the peers wait a fixed 100 ms;
//! the refill is continuous (in ns), not stepped. A transmit frame or a block request knows
//! its cost before it goes: it waits for it. A received frame's length is known only once
//! it is read straight into the guest's buffers, so receive goes when the buckets hold at
//! least one token and is charged its real length after: the bucket may owe up to one frame,
//! which the next frames wait for (the long-run rate is exact; a burst may pass one frame
//! over the size).
//!
//! Data flow: the spec parser ([`parse`]) turns `rx-bytes:125M/1s+tx-packets:10k/1s` into
//! [`BucketSpec`]s keyed by what they limit; a device makes a [`SharedLimiter`] per direction
//! (limiting nothing until it has buckets; `set-rate` replaces them), shared by its queue threads (a lock only those threads take, never a reader);
//! a pass asks it before each frame or request ([`Limiter::try_take`], [`Limiter::admit`] and
//! [`Limiter::charge`]) and, refused, stops and says how long to wait; the thread arms its
//! timer and stops serving that queue meanwhile, the time stamped in the queue's
//! [`ThrottleClock`], which readers read live without a lock.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;

use thiserror::Error;

use crate::devices::cut;

/// The shortest wait of a throttled queue: bounds its timer's wakeups to 10,000 a second.
pub const MIN_WAIT_NS: u64 = 100_000;
/// The shortest refill time (Firecracker's unit is 1 ms).
pub const MIN_REFILL_NS: u64 = 1_000_000;
/// The longest refill time.
pub const MAX_REFILL_NS: u64 = 3_600_000_000_000;
/// The largest bucket (and one-time burst): 2^48 tokens.
pub const MAX_SIZE: u64 = 1 << 48;

/// Why a `rate=` value was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RateSpecError {
    /// An empty value.
    #[error("rate= is empty; give buckets like {0}")]
    Empty(&'static str),
    /// A bucket not of the form `KIND:SIZE/TIME`.
    #[error("`{0}` is not a bucket of the form KIND:SIZE/TIME[:burst=N] (e.g. {1})")]
    Form(String, &'static str),
    /// A kind the device does not limit.
    #[error("`{0}` is not something this device limits (it takes {1})")]
    Kind(String, String),
    /// A kind given twice.
    #[error("the bucket `{0}` is given twice")]
    Duplicate(String),
    /// A bad size or burst.
    #[error("`{0}` is not a size: a whole number from 1 to 2^48, optionally with k, M, G (1000s) or Ki, Mi, Gi (1024s)")]
    Size(String),
    /// A bad refill time.
    #[error("`{0}` is not a refill time from 1ms to 1h (a number with ns, us, ms or s; `s` alone is 1s)")]
    Time(String),
    /// `set-rate` named a device without rate limiters.
    #[error("the device `{0}` has no rate limiter (network devices and disks have)")]
    NotLimited(String),
}

/// The value of `set-rate` that takes every bucket away.
pub const NONE: &str = "none";

/// One bucket as configured: `size` tokens refilled at `size` per `refill_ns`, and a one-time
/// `burst` spent first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketSpec {
    /// Tokens it holds, full.
    pub size: u64,
    /// The time it takes to refill from empty.
    pub refill_ns: u64,
    /// Tokens given once, on top, spent before the budget (Firecracker's `one_time_burst`).
    pub burst: u64,
}

impl BucketSpec {
    /// Tokens per second (rounded down).
    pub fn per_second(&self) -> u64 {
        (u128::from(self.size) * 1_000_000_000 / u128::from(self.refill_ns)) as u64
    }
}

impl fmt::Display for BucketSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.refill_ns;
        write!(f, "{}/", self.size)?;
        if t % 1_000_000_000 == 0 {
            write!(f, "{}s", t / 1_000_000_000)?;
        } else if t % 1_000_000 == 0 {
            write!(f, "{}ms", t / 1_000_000)?;
        } else if t % 1_000 == 0 {
            write!(f, "{}us", t / 1_000)?;
        } else {
            write!(f, "{t}ns")?;
        }
        if self.burst > 0 {
            write!(f, ":burst={}", self.burst)?;
        }
        Ok(())
    }
}

/// The buckets of one direction (or of a disk): bytes and operations, each optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateSpec {
    /// Bytes.
    pub bytes: Option<BucketSpec>,
    /// Operations: frames (network) or requests (disk).
    pub ops: Option<BucketSpec>,
}

impl RateSpec {
    /// Whether any bucket limits.
    pub fn limits(&self) -> bool {
        self.bytes.is_some() || self.ops.is_some()
    }

    /// `prefix-bytes:…+prefix-OPS:…`, as `rate=` takes it (`ops` names the operations).
    pub fn describe(&self, prefix: &str, ops: &str) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(b) = &self.bytes {
            out.push(format!("{prefix}bytes:{b}"));
        }
        if let Some(b) = &self.ops {
            out.push(format!("{prefix}{ops}:{b}"));
        }
        out
    }
}

fn parse_size(s: &str) -> Option<u64> {
    let (digits, mult) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1_000),
        ("K", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ]
    .iter()
    .find_map(|(suf, m)| s.strip_suffix(suf).map(|d| (d, *m)))
    .unwrap_or((s, 1));
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits
        .parse::<u64>()
        .ok()?
        .checked_mul(mult)
        .filter(|v| (1..=MAX_SIZE).contains(v))
}

fn parse_time(s: &str) -> Option<u64> {
    let (digits, mult) = [
        ("ns", 1u64),
        ("us", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
    ]
    .iter()
    .find_map(|(suf, m)| s.strip_suffix(suf).map(|d| (d, *m)))?;
    let n = if digits.is_empty() {
        1
    } else if digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse::<u64>().ok()?
    } else {
        return None;
    };
    n.checked_mul(mult)
        .filter(|v| (MIN_REFILL_NS..=MAX_REFILL_NS).contains(v))
}

/// Parses `KIND:SIZE/TIME[:burst=N]` buckets joined by `+`; `kinds` are those the device
/// takes (`example` is shown in errors). Returns each bucket with its kind's index in
/// `kinds`.
pub fn parse(
    value: &str,
    kinds: &[&'static str],
    example: &'static str,
) -> Result<Vec<(usize, BucketSpec)>, RateSpecError> {
    if value.is_empty() {
        return Err(RateSpecError::Empty(example));
    }
    let mut out: Vec<(usize, BucketSpec)> = Vec::new();
    for part in value.split('+') {
        let form = || RateSpecError::Form(cut(part), example);
        let mut fields = part.split(':');
        let kind = fields.next().ok_or_else(form)?;
        let rate = fields.next().ok_or_else(form)?;
        let burst = match fields.next() {
            None => 0,
            Some(b) => {
                let v = b.strip_prefix("burst=").ok_or_else(form)?;
                parse_size(v).ok_or_else(|| RateSpecError::Size(cut(v)))?
            }
        };
        if fields.next().is_some() {
            return Err(form());
        }
        let k = kinds
            .iter()
            .position(|k| *k == kind)
            .ok_or_else(|| RateSpecError::Kind(cut(kind), kinds.join(", ")))?;
        if out.iter().any(|(seen, _)| *seen == k) {
            return Err(RateSpecError::Duplicate(cut(kind)));
        }
        let (size, time) = rate.split_once('/').ok_or_else(form)?;
        let size = parse_size(size).ok_or_else(|| RateSpecError::Size(cut(size)))?;
        let refill_ns = parse_time(time).ok_or_else(|| RateSpecError::Time(cut(time)))?;
        out.push((
            k,
            BucketSpec {
                size,
                refill_ns,
                burst,
            },
        ));
    }
    Ok(out)
}

/// One bucket's state. Credit is kept in tokens × refill ns, so the refill is exact in
/// integers: `dt` ns add `dt × size`.
#[derive(Debug, Clone)]
pub struct Bucket {
    spec: BucketSpec,
    /// Tokens × refill_ns; negative while a received frame's debt is paid.
    credit: i128,
    burst: u64,
    last_ns: u64,
}

impl Bucket {
    /// A full bucket at `now_ns`.
    pub fn new(spec: BucketSpec, now_ns: u64) -> Self {
        Bucket {
            spec,
            credit: Self::scaled(&spec, spec.size),
            burst: spec.burst,
            last_ns: now_ns,
        }
    }

    fn scaled(spec: &BucketSpec, tokens: u64) -> i128 {
        i128::from(tokens) * i128::from(spec.refill_ns)
    }

    fn refill(&mut self, now_ns: u64) {
        let dt = now_ns.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now_ns);
        let cap = Self::scaled(&self.spec, self.spec.size);
        self.credit = (self.credit + i128::from(dt) * i128::from(self.spec.size)).min(cap);
    }

    /// How long until the bucket can give `cost` tokens (0: now). A cost over the size waits
    /// for a full bucket and leaves it owing the rest.
    fn wait_for(&self, cost: u64) -> u64 {
        let need = cost.saturating_sub(self.burst).min(self.spec.size);
        if need == 0 {
            return 0;
        }
        let short = Self::scaled(&self.spec, need) - self.credit;
        if short <= 0 {
            return 0;
        }
        let size = i128::from(self.spec.size);
        ((short + size - 1) / size).min(i128::from(u64::MAX)) as u64
    }

    /// Takes `cost` tokens: the burst first, then the budget (which may go negative).
    fn take(&mut self, cost: u64) {
        let from_burst = cost.min(self.burst);
        self.burst -= from_burst;
        self.credit -= Self::scaled(&self.spec, cost - from_burst);
    }

    /// Whole tokens it holds now (0 while it owes), for tests and the figures.
    pub fn tokens(&self) -> u64 {
        (self.credit.max(0) / i128::from(self.spec.refill_ns)) as u64 + self.burst
    }
}

/// The buckets of one direction: bytes and operations.
#[derive(Debug, Clone)]
pub struct Limiter {
    bytes: Option<Bucket>,
    ops: Option<Bucket>,
}

impl Limiter {
    /// Full buckets as `spec` says, at `now_ns`.
    pub fn new(spec: &RateSpec, now_ns: u64) -> Self {
        Limiter {
            bytes: spec.bytes.map(|b| Bucket::new(b, now_ns)),
            ops: spec.ops.map(|b| Bucket::new(b, now_ns)),
        }
    }

    fn refill(&mut self, now_ns: u64) {
        for b in self.bytes.iter_mut().chain(self.ops.iter_mut()) {
            b.refill(now_ns);
        }
    }

    fn wait(&self, bytes: u64) -> u64 {
        let w = |b: &Option<Bucket>, cost| b.as_ref().map_or(0, |b| b.wait_for(cost));
        w(&self.bytes, bytes).max(w(&self.ops, 1))
    }

    /// One operation of `bytes` (a frame to send, a request): taken from both buckets and
    /// `Ok`, or nothing taken and how long to wait (ns, at least [`MIN_WAIT_NS`]).
    pub fn try_take(&mut self, now_ns: u64, bytes: u64) -> Result<(), u64> {
        self.refill(now_ns);
        match self.wait(bytes) {
            0 => {
                self.charge_refilled(bytes);
                Ok(())
            }
            w => Err(w.max(MIN_WAIT_NS)),
        }
    }

    /// Whether an operation of unknown size may go (a frame to receive): both buckets hold at
    /// least one token; else how long to wait. Nothing is taken: [`Limiter::charge`] does it
    /// once the size is known.
    pub fn admit(&mut self, now_ns: u64) -> Result<(), u64> {
        self.refill(now_ns);
        match self.wait(1) {
            0 => Ok(()),
            w => Err(w.max(MIN_WAIT_NS)),
        }
    }

    /// Charges one operation of `bytes` admitted before (the bytes bucket may owe).
    pub fn charge(&mut self, now_ns: u64, bytes: u64) {
        self.refill(now_ns);
        self.charge_refilled(bytes);
    }

    fn charge_refilled(&mut self, bytes: u64) {
        if let Some(b) = self.bytes.as_mut() {
            b.take(bytes);
        }
        if let Some(b) = self.ops.as_mut() {
            b.take(1);
        }
    }

    /// The bytes bucket, for tests.
    pub fn bytes(&self) -> Option<&Bucket> {
        self.bytes.as_ref()
    }
}

/// A limiter its device's queue threads share: a lock only they take (one per frame or
/// request), never a reader. Every limited device has one per direction from its start,
/// limiting nothing until it has buckets, so `set-rate` can give it some, change them or take
/// them away while the VM runs ([`SharedLimiter::set`]).
#[derive(Debug)]
pub struct SharedLimiter {
    /// What it limits now, for the figures: taken by `set` and the readers, never by the
    /// queue threads.
    spec: Mutex<RateSpec>,
    /// Whether it has a bucket: the queue threads ask it only then.
    active: AtomicBool,
    state: Mutex<Limiter>,
    /// The time its buckets refill by (ns): the monotonic clock, or a fuzzer model's own.
    clock: fn() -> u64,
}

impl SharedLimiter {
    /// Full buckets as `spec` says; None when it limits nothing.
    pub fn new(spec: &RateSpec) -> Option<Self> {
        spec.limits().then(|| Self::always(spec))
    }

    /// Full buckets as `spec` says, or none (it limits nothing until [`SharedLimiter::set`]).
    pub fn always(spec: &RateSpec) -> Self {
        Self::on_clock(spec, crate::sync::now_ns)
    }

    /// As [`SharedLimiter::always`], its buckets refilling by `clock` (ns) instead of the
    /// monotonic clock: the fuzzer's models keep their own time, so that a wait for tokens
    /// ends when the model says and an input replays the same.
    pub fn on_clock(spec: &RateSpec, clock: fn() -> u64) -> Self {
        SharedLimiter {
            spec: Mutex::new(*spec),
            active: AtomicBool::new(spec.limits()),
            state: Mutex::new(Limiter::new(spec, clock())),
            clock,
        }
    }

    /// What it limits now.
    pub fn spec(&self) -> RateSpec {
        *self.spec.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether it has a bucket (the queue threads ask it only then).
    pub fn limits(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Replaces the buckets with full ones as `spec` says (none: it limits nothing), as
    /// Firecracker's rate-limiter update does. A queue waiting for the old buckets' tokens is
    /// woken by its device to ask the new ones.
    pub fn set(&self, spec: &RateSpec) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *st = Limiter::new(spec, (self.clock)());
        *self.spec.lock().unwrap_or_else(|e| e.into_inner()) = *spec;
        self.active.store(spec.limits(), Ordering::Release);
    }

    fn with<T>(&self, f: impl FnOnce(&mut Limiter, u64) -> T) -> T {
        let mut l = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut l, (self.clock)())
    }

    /// [`Limiter::try_take`] now.
    pub fn try_take(&self, bytes: u64) -> Result<(), u64> {
        self.with(|l, now| l.try_take(now, bytes))
    }

    /// [`Limiter::admit`] now.
    pub fn admit(&self) -> Result<(), u64> {
        self.with(|l, now| l.admit(now))
    }

    /// [`Limiter::charge`] now.
    pub fn charge(&self, bytes: u64) {
        self.with(|l, now| l.charge(now, bytes));
    }
}

/// A queue's time spent throttled, written by the one thread that serves the queue, read
/// live by anyone without a lock: one signed word that holds the total while the queue runs,
/// and the total less the start of the throttle (CLOCK_MONOTONIC ns, larger than any total)
/// while it waits, so a reader adds `now` to a negative word.
#[derive(Debug, Default)]
pub struct ThrottleClock(AtomicI64);

impl ThrottleClock {
    /// The queue stops for its rate at `now_ns` (nothing if it already waits).
    pub fn begin(&self, now_ns: u64) {
        let v = self.0.load(Ordering::Relaxed);
        if v >= 0 {
            self.0.store(v - now_ns as i64, Ordering::Release);
        }
    }

    /// The queue serves again at `now_ns` (nothing if it did not wait).
    pub fn end(&self, now_ns: u64) {
        let v = self.0.load(Ordering::Relaxed);
        if v < 0 {
            self.0.store(v + now_ns as i64, Ordering::Release);
        }
    }

    /// Whether the queue waits now.
    pub fn waiting(&self) -> bool {
        self.0.load(Ordering::Acquire) < 0
    }

    /// Time throttled up to `now_ns`, the wait in progress included.
    pub fn total_ns(&self, now_ns: u64) -> u64 {
        let v = self.0.load(Ordering::Acquire);
        if v < 0 {
            (v + now_ns as i64).max(0) as u64
        } else {
            v as u64
        }
    }
}

pub mod wait;

#[cfg(test)]
mod tests;
