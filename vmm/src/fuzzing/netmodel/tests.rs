//! The model on scenarios a network function meets (bursts past the ring, control commands
//! in a row, a transmit flood past the budget, resets in a burst, a thread that lags), and on
//! pseudo-random inputs: each must reach quiescence with nothing left.

use super::run;

/// Setup bytes: queue size 2^(a % 11) (chains of 1 + (a >> 4) % 3 descriptors without
/// mergeable buffers), flags (1 EVENT_IDX, 2 mergeable, 4 control queue, 8 MQ, 16 guest GSO,
/// 32 a lagging thread, 64 a receive rate limit, 128 a transmit one), receive buffer bytes /
/// 16 (and the buckets' sizes: see `setup` in the model).
fn setup(size_log2: u8, flags: u8, rx_buf: u32) -> Vec<u8> {
    vec![size_log2, flags, (rx_buf / 16) as u8]
}

const EVENT_IDX: u8 = 1;
const MERGEABLE: u8 = 2;
const CTRL: u8 = 4;
const MQ: u8 = 8;
const LAG: u8 = 32;
const RX_RATE: u8 = 64;
const TX_RATE: u8 = 128;

/// The host sends `bursts` × 64 small frames, the device drains between, the driver polls.
fn burst(mut v: Vec<u8>, bursts: usize) -> Vec<u8> {
    for _ in 0..bursts {
        v.extend([3, 63, 0]); // 64 frames of a few bytes
        v.extend([9]); // the device runs what is pending
        v.extend([6 | 0x80]); // the driver polls
    }
    v
}

#[test]
fn a_burst_many_times_the_ring_keeps_being_received_linux_style() {
    // 256 entries, EVENT_IDX and mergeable buffers as Linux negotiates them: 20 bursts of 64
    // drain the ring again and again; the driver refills, and must get to kick each time.
    run(&burst(setup(8, EVENT_IDX | MERGEABLE, 1536), 20));
    // Small rings, without mergeable buffers, chains of two descriptors, without EVENT_IDX.
    run(&burst(setup(2 | (1 << 4), 0, 2048), 10));
    run(&burst(setup(0, EVENT_IDX, 2048), 10));
    run(&burst(setup(10, EVENT_IDX | MERGEABLE, 1536), 5));
}

#[test]
fn control_commands_in_a_row_are_each_kicked_and_answered() {
    for flags in [EVENT_IDX | CTRL | MQ, CTRL | MQ, EVENT_IDX | CTRL, CTRL] {
        let mut v = setup(4, flags | MERGEABLE, 1536);
        for n in [1u8, 2, 1, 2, 0] {
            v.extend([2, n, 9, 6 | 0x80]);
        }
        run(&v);
    }
}

#[test]
fn a_transmit_flood_past_the_budget_is_sent_whole() {
    let mut v = setup(10, EVENT_IDX | MERGEABLE, 1536);
    for _ in 0..40 {
        v.extend([1, 15, 8]); // 16 frames of 76 bytes
    }
    v.extend([4, 0, 9]);
    run(&v);
}

#[test]
fn resets_during_bursts_with_a_lagging_thread_leave_a_working_device() {
    for flags in [
        EVENT_IDX | MERGEABLE | LAG,
        MERGEABLE | CTRL | LAG,
        EVENT_IDX,
    ] {
        let mut v = setup(6, flags, 1536);
        v.extend([
            3, 63, 0, 4, 0, 1, 9, 8, 7, 4, 1, 5, 3, 8, 3, 40, 2, 7, 7, 8, 9, 6, 0,
        ]);
        v = burst(v, 3);
        run(&v);
    }
}

#[test]
fn interrupts_asked_off_while_the_driver_polls_are_not_raised() {
    // Without EVENT_IDX the driver polls with NO_INTERRUPT set; the device's passes run in
    // between and must not interrupt (the model asserts it at each pass).
    for flags in [MERGEABLE, EVENT_IDX | MERGEABLE] {
        let mut v = setup(5, flags, 1536);
        for _ in 0..8 {
            // Frames, a poll started (interrupts off), the device runs, frames, the poll ends.
            v.extend([3, 20, 0, 6 | 0x40, 9, 1, 3, 8, 9, 6 | 0x80]);
        }
        run(&v);
    }
}

#[test]
fn pseudo_random_inputs_reach_quiescence_with_nothing_left() {
    // xorshift64*: the same inputs every run.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for k in 0..300 {
        let len = 3 + (next() % 120) as usize;
        let v: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if std::panic::catch_unwind(|| run(&v)).is_err() {
            panic!("input {k} fails: {v:?}");
        }
    }
}

#[test]
fn rate_limited_ways_wait_for_their_timer_and_leave_nothing() {
    // Bursts past small buckets each way: the passes stop for tokens (the model's clock
    // moves only when a rate timer fires), kicks meanwhile start nothing, and at quiescence
    // every frame was received or sent all the same; with a reset while a way waits, and a
    // lagging thread.
    for flags in [
        EVENT_IDX | MERGEABLE | RX_RATE | TX_RATE,
        RX_RATE,
        TX_RATE | LAG,
        EVENT_IDX | RX_RATE | TX_RATE | CTRL | MQ,
    ] {
        let mut v = burst(setup(6, flags, 1536), 4);
        for _ in 0..8 {
            v.extend([1, 15, 8, 4, 1]); // 16 frames of 76 bytes, one device step
        }
        v.extend([3, 63, 0, 4, 0, 7, 1, 15, 8, 9]); // a burst, a reset, more to send
        let t0 = super::model_now();
        run(&v);
        assert!(
            super::model_now() > t0,
            "flags {flags:#x}: no pass waited for tokens"
        );
    }
}
