//! PSI's running averages, as Linux computes them (kernel/sched/psi.c `update_averages` and
//! `calc_avgs`, kernel/sched/loadavg.c `calc_load` and `calc_load_n`): every 2 s the stall time
//! of the period just ended becomes a percentage in 11-bit fixed point and is folded into
//! three exponentially decaying averages with the constants `EXP_10s` 1677, `EXP_60s` 1981 and
//! `EXP_300s` 2034 (of `FIXED_1` 2048: e^(−2/10), e^(−2/60), e^(−2/300)). Periods the update
//! missed decay the averages towards zero first; a period's stall above its length is carried
//! into the next period (as Linux does). The figures are reported in hundredths of a percent,
//! as Linux prints them (`LOAD_INT`.`LOAD_FRAC`).
//!
//! Data flow: the pressure tracker (`pressure.rs`, on the sampler thread) calls
//! [`Averages::update`] with each state's running total whenever a period is due.

/// Fixed-point shift of the averages.
pub const FSHIFT: u32 = 11;
/// 1.0 in fixed point.
pub const FIXED_1: u64 = 1 << FSHIFT;
/// e^(−2 s / 10 s) in fixed point.
pub const EXP_10S: u64 = 1677;
/// e^(−2 s / 60 s).
pub const EXP_60S: u64 = 1981;
/// e^(−2 s / 300 s).
pub const EXP_300S: u64 = 2034;
/// The update period, ns (Linux: 2 s and one jiffy).
pub const PERIOD_NS: u64 = 2_000_000_000;

const EXPS: [u64; 3] = [EXP_10S, EXP_60S, EXP_300S];

/// One decay step: `load` moves towards `active` by the weight 1 − `exp`, rounded up when it
/// rises (Linux's `calc_load`).
pub fn calc_load(load: u64, exp: u64, active: u64) -> u64 {
    let mut new = load * exp + active * (FIXED_1 - exp);
    if active >= load {
        new += FIXED_1 - 1;
    }
    new / FIXED_1
}

/// `x`^`n` in fixed point of `frac_bits`, rounding each product to nearest (Linux's
/// `fixed_power_int`).
pub fn fixed_power_int(mut x: u64, frac_bits: u32, mut n: u32) -> u64 {
    let mut result = 1u64 << frac_bits;
    let half = 1u64 << (frac_bits - 1);
    while n != 0 {
        if n & 1 == 1 {
            result = (result * x + half) >> frac_bits;
        }
        n >>= 1;
        if n == 0 {
            break;
        }
        x = (x * x + half) >> frac_bits;
    }
    result
}

/// `n` decay steps at once (Linux's `calc_load_n`).
pub fn calc_load_n(load: u64, exp: u64, active: u64, n: u32) -> u64 {
    calc_load(load, fixed_power_int(exp, FSHIFT, n), active)
}

/// Folds one period into the three averages: `missed` empty periods, then the stall `time` of
/// a period of `period` ns (Linux's `calc_avgs`).
pub fn calc_avgs(avg: &mut [u64; 3], missed: u32, time: u64, period: u64) {
    if missed > 0 {
        for (a, e) in avg.iter_mut().zip(EXPS) {
            *a = calc_load_n(*a, e, 0, missed);
        }
    }
    let pct = time * 100 / period.max(1) * FIXED_1;
    for (a, e) in avg.iter_mut().zip(EXPS) {
        *a = calc_load(*a, e, pct);
    }
}

/// A fixed-point average as hundredths of a percent (`LOAD_INT` × 100 + `LOAD_FRAC`).
pub fn hundredths(avg: u64) -> u32 {
    let int = avg >> FSHIFT;
    let frac = ((avg & (FIXED_1 - 1)) * 100) >> FSHIFT;
    u32::try_from(int * 100 + frac).unwrap_or(u32::MAX)
}

/// The averages of `N` states (here `some` and `full`) of one group, updated together.
#[derive(Debug, Clone)]
pub struct Averages<const N: usize> {
    next_update: u64,
    last_update: u64,
    avg_total: [u64; N],
    avg: [[u64; 3]; N],
}

impl<const N: usize> Averages<N> {
    /// Averages that start at `now` (ns): the first period ends at `now` + 2 s.
    pub fn new(now: u64) -> Self {
        Averages {
            next_update: now + PERIOD_NS,
            last_update: now,
            avg_total: [0; N],
            avg: [[0; 3]; N],
        }
    }

    /// Whether a period is due at `now`.
    pub fn due(&self, now: u64) -> bool {
        now >= self.next_update
    }

    /// At `now`, with each state's running stall total (ns): closes the periods that are due
    /// (Linux's `update_averages`). Does nothing before the next period is due.
    pub fn update(&mut self, now: u64, totals: [u64; N]) {
        if !self.due(now) {
            return;
        }
        let expires = self.next_update;
        let missed = (now - expires) / PERIOD_NS;
        self.next_update = expires + (1 + missed) * PERIOD_NS;
        let period = now.saturating_sub(self.last_update + missed * PERIOD_NS);
        self.last_update = now;
        let missed = u32::try_from(missed).unwrap_or(u32::MAX);
        for ((total, avg_total), avg) in totals
            .iter()
            .zip(self.avg_total.iter_mut())
            .zip(self.avg.iter_mut())
        {
            // Linux keeps the sample in a u32 of ns; a period is 2 s, so it fits.
            let sample = total.saturating_sub(*avg_total).min(period);
            *avg_total += sample;
            calc_avgs(avg, missed, sample, period);
        }
    }

    /// State `s`'s averages (10 s, 60 s, 300 s) in hundredths of a percent.
    pub fn hundredths(&self, s: usize) -> [u32; 3] {
        self.avg[s].map(hundredths)
    }
}
