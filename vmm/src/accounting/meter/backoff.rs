//! How a meter reader waits for a writer inside its section: spin, yield a few times, then
//! sleep with a doubling back-off. Pure, so the schedule is unit-tested.

/// How long a meter reader sleeps in all before it gives up on a writer, µs.
pub(super) const READ_GIVE_UP_US: u64 = 2_000_000;

/// What a meter reader does after failed attempt `attempt`: spin (`None`), yield
/// (`Some(0)`), or sleep so many µs. Spinning and a few yields cover a writer running on
/// another CPU; a writer preempted inside its section is back only after the scheduler's
/// other threads had their turn, and sleeping 100 µs at a time through that wait cost a
/// context switch each: a `stats` snapshot that met one (a few in ten thousand meter reads
/// at 64 busy vCPUs here) spent ~3 ms of CPU in ~200 sleeps, and a thousand yields before
/// them did nothing at SCHED_FIFO (no thread of its priority to yield to). So the sleep
/// doubles from 50 µs up to 1 ms: a reader is at most ~1 ms late for the writer's return.
pub(super) fn backoff_us(attempt: u32) -> Option<u64> {
    match attempt {
        0..=63 => None,
        64..=79 => Some(0),
        n => Some((50u64 << (n - 80).min(5)).min(1_000)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_then_yields_a_few_times_then_sleeps_doubling_to_a_millisecond() {
        assert!((0..64).all(|a| backoff_us(a).is_none()));
        assert!((64..80).all(|a| backoff_us(a) == Some(0)));
        let sleeps: Vec<u64> = (80..90).filter_map(backoff_us).collect();
        assert_eq!(
            sleeps,
            [50, 100, 200, 400, 800, 1000, 1000, 1000, 1000, 1000]
        );
        assert_eq!(backoff_us(u32::MAX), Some(1000));
        // A writer away for 130 ms costs a reader ~135 sleeps, not 1 300 of 100 µs.
        let (mut slept, mut n) = (0, 0);
        for a in 80.. {
            if slept >= 130_000 {
                break;
            }
            slept += backoff_us(a).unwrap();
            n += 1;
        }
        assert!(n < 140, "{n} sleeps");
        // Giving up takes ~2 s of sleep, as before.
        assert_eq!(READ_GIVE_UP_US, 2_000_000);
    }
}
