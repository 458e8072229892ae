//! A network device's rate limiter end to end on this host (`--net …,rate=`), with the tiny
//! guest's polled driver and a tap in a network namespace of the test's own (frames of the
//! local experimental EtherType 0x88B5, never IP). Each test checks that nothing is lost,
//! that the device never passed more than its buckets allow over the time the test saw
//! (a bound a slow host cannot break: slowness only sends less), and that the waits are in
//! the queue's figures.

mod common;

use std::time::{Duration, Instant};

use common::netns::NetNs;
use common::vmm::Vmm;
use serde_json::Value;

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// The most a bucket of `size` refilled at `size` per `refill` lets through in `elapsed`.
fn most(size: u64, refill: Duration, elapsed: Duration) -> u64 {
    size + (size as f64 * elapsed.as_secs_f64() / refill.as_secs_f64()).ceil() as u64
}

/// The queue's waits are counted, timed within the run, and the device's threads' identity
/// holds (a wait is time in the event loop).
fn assert_waits(dev: &Value, q: &Value, elapsed: Duration) {
    assert!(n(&q["throttles"]) > 0, "{q}");
    let waited = n(&q["throttled_ns"]);
    assert!(
        waited > 0 && waited < elapsed.as_nanos() as u64,
        "{waited} ns of {elapsed:?}: {q}"
    );
    for t in dev["threads"].as_array().unwrap() {
        let parts = n(&t["used_ns"])
            + n(&t["steal_ns"])
            + n(&t["waiting_ns"])
            + n(&t["blocked_ns"])
            + n(&t["limited_ns"]);
        assert_eq!(n(&t["wall_ns"]), parts, "identity of {t}");
    }
}

#[test]
fn transmit_at_a_packet_rate_loses_nothing_and_never_passes_the_rate() {
    let _g = common::serial();
    let ns = NetNs::new(false);
    let before = ns.tap_counter("rx_packets");
    let t0 = Instant::now();
    // 500 frames a 100 ms (5,000 a second): 3,000 frames take at least half a second where
    // the guest alone sends them in a few ms.
    let mut vmm = Vmm::start_in(
        &ns.name,
        "net-rate-tx",
        &[
            "--net",
            "tap=tap0,rate=tx-packets:500/100ms",
            "--workload",
            "net-tx:packets=3000,size=64",
        ],
    );
    let (code, r) = vmm.wait();
    let elapsed = t0.elapsed();
    assert_eq!(code, 0, "{r}");
    let dev = &r["devices"][0];
    assert_eq!(dev["rate"], "tx-packets:500/100ms", "{dev}");
    let tx = &dev["queues"][1];
    assert_eq!(n(&r["vcpus"][0]["guest_reported"]["net_sent"]), 3_000);
    assert_eq!(
        n(&tx["packets"]),
        3_000,
        "the rate waits, it drops nothing: {tx}"
    );
    assert_eq!(ns.tap_counter("rx_packets") - before, 3_000);
    let bound = most(500, Duration::from_millis(100), elapsed);
    assert!(
        3_000 <= bound,
        "3,000 frames in {elapsed:?} is more than the rate lets through ({bound})"
    );
    eprintln!(
        "tx: 3000 frames in {elapsed:?} ({:.0}/s of 5000/s, the bucket's 500 included), waited {} ms in {} stops",
        3000.0 / elapsed.as_secs_f64(),
        n(&tx["throttled_ns"]) / 1_000_000,
        n(&tx["throttles"])
    );
    assert_waits(dev, tx, elapsed);
    let rx = &dev["queues"][0];
    assert_eq!(n(&rx["throttles"]), 0, "receive has no limit: {rx}");
}

#[test]
fn receive_at_a_byte_rate_delivers_every_frame_within_the_rate() {
    let _g = common::serial();
    let ns = NetNs::new(false);
    // 32,000 bytes a 100 ms: 2,000 frames of 64 bytes are 128,000 bytes, which take at least
    // 300 ms beyond the full bucket.
    let vmm = Vmm::start_in(
        &ns.name,
        "net-rate-rx",
        &[
            "--net",
            "tap=tap0,rate=rx-bytes:32000/100ms",
            "--workload",
            "net-rx:packets=2000,ms=60000",
        ],
    );
    vmm.wait_driver("net0");
    let t0 = Instant::now();
    // Bursts of at most 256 frames ahead of the guest: the tap holds them all while the rate
    // makes the device wait.
    let sent = ns.send_paced(vmm.sock.clone(), 2_000, 256);
    assert_eq!(sent, 2_000);
    let mut vmm = vmm;
    let (code, r) = vmm.wait();
    let elapsed = t0.elapsed();
    assert_eq!(code, 0, "{r}");
    let dev = &r["devices"][0];
    let rx = &dev["queues"][0];
    assert_eq!(n(&r["vcpus"][0]["guest_reported"]["net_received"]), 2_000);
    assert_eq!(n(&rx["packets"]), 2_000, "{rx}");
    let bytes = n(&rx["bytes"]);
    assert_eq!(bytes, 2_000 * 64);
    // A received frame is charged once read, so the bucket may owe one frame more.
    let bound = most(32_000, Duration::from_millis(100), elapsed) + 64;
    assert!(
        bytes <= bound,
        "{bytes} bytes in {elapsed:?} is more than the rate lets through ({bound})"
    );
    eprintln!(
        "rx: {bytes} bytes in {elapsed:?} ({:.0}/s of 320000/s, the bucket's 32000 included), waited {} ms in {} stops",
        bytes as f64 / elapsed.as_secs_f64(),
        n(&rx["throttled_ns"]) / 1_000_000,
        n(&rx["throttles"])
    );
    assert_waits(dev, rx, elapsed);
}

/// The transmit queue's figures of device `name` now (`device` over the socket).
fn tx_queue(c: &mut common::vmm::Conn, name: &str) -> Value {
    let d = c.ok(serde_json::json!({"cmd": "device", "name": name}));
    d["queues"][1].clone()
}

/// `set-rate` (issue 36): a device started without a limiter is limited while the guest
/// floods it, and over a window after the change it passes no more than the new buckets allow
/// (a bound a slow host cannot break); bad values and unknown devices are refused with their
/// kind and change nothing; `none` takes the limit away, and the queue is throttled no more.
#[test]
fn set_rate_limits_a_running_device_and_takes_the_limit_away() {
    let _g = common::serial();
    let ns = NetNs::new(false);
    let t_start = Instant::now();
    let vmm = Vmm::start_in(
        &ns.name,
        "net-rate-live",
        &[
            "--net",
            "tap=tap0",
            "--workload",
            "net-tx:packets=100000000,size=64",
        ],
    );
    vmm.wait_driver("net0");
    let mut c = vmm.connect();
    let set = |rate: &str| serde_json::json!({"cmd": "set-rate", "device": "net0", "rate": rate});
    for (req, kind) in [
        (set("tx-packets:0/1s"), "bad-rate"),
        (set("rx-frames:10/1s"), "bad-rate"),
        (set(""), "bad-rate"),
        (
            serde_json::json!({"cmd": "set-rate", "device": "net9", "rate": "none"}),
            "no-such-device",
        ),
    ] {
        let r = c.call(req.clone());
        assert_eq!(r["error"]["kind"], kind, "{req} -> {r}");
    }
    assert_eq!(
        tx_queue(&mut c, "net0")["throttles"],
        0,
        "the refusals set nothing"
    );
    // 200 frames a 100 ms, where the guest sends hundreds of thousands a second.
    let t0 = Instant::now();
    let d = c.ok(set("tx-packets:200/100ms"));
    assert_eq!(d["rate"], "tx-packets:200/100ms", "{d}");
    let p0 = n(&tx_queue(&mut c, "net0")["packets"]);
    std::thread::sleep(Duration::from_millis(1000));
    let q = tx_queue(&mut c, "net0");
    let elapsed = t0.elapsed();
    let sent = n(&q["packets"]) - p0;
    // A pass that began before the change ends under the old (no) limit: at most its budget
    // of 256 chains more.
    let bound = most(200, Duration::from_millis(100), elapsed) + 256;
    assert!(
        sent <= bound,
        "{sent} frames in {elapsed:?} after set-rate: more than the new rate lets through ({bound})"
    );
    assert!(n(&q["throttles"]) > 0, "the flood met the new limit: {q}");
    eprintln!("set-rate: {sent} frames in {elapsed:?} after the change (bound {bound})");
    // `none`: no bucket, and no throttle from then on (a look after a pause, so that a stop
    // the old buckets made just before the change is counted already).
    let d = c.ok(set("none"));
    assert_eq!(d["rate"], Value::Null, "{d}");
    std::thread::sleep(Duration::from_millis(200));
    let t1 = n(&tx_queue(&mut c, "net0")["throttles"]);
    std::thread::sleep(Duration::from_millis(300));
    let q = tx_queue(&mut c, "net0");
    assert_eq!(
        n(&q["throttles"]),
        t1,
        "throttled after its limit was taken away: {q}"
    );
    drop(c);
    let (code, r) = vmm.shutdown();
    assert_eq!(code, 0, "{r}");
    let dev = &r["devices"][0];
    assert_eq!(dev["rate"], Value::Null, "{dev}");
    assert_waits(dev, &dev["queues"][1], t_start.elapsed());
}
