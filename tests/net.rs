//! virtio-net end to end on this host, with the tiny guest's polled driver: frames through a
//! real tap in a network namespace of the test's own (nothing leaves the machine; the frames
//! carry the local experimental EtherType 0x88B5, never IP). Each test counts the same frames
//! three ways: what the guest counted itself, what the device counted, and what the tap's own
//! counters say.

mod common;

use std::time::Duration;

use common::netns::{test_frame, NetNs, PacketSocket};
use common::vmm::{bin, Vmm};
use serde_json::{json, Value};

/// The first device of a report or of `stats`.
fn device(v: &Value) -> &Value {
    &v["devices"][0]
}

/// The queue `i` of a device.
fn queue(dev: &Value, i: usize) -> &Value {
    &dev["queues"][i]
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Sum of a queue's drops over every reason.
fn drops(q: &Value) -> u64 {
    q["drops"]
        .as_object()
        .map_or(0, |m| m.values().map(n).sum())
}

/// Every device thread's identity holds and its CPU is there.
fn assert_threads(dev: &Value) {
    for t in dev["threads"].as_array().unwrap() {
        let wall = n(&t["wall_ns"]);
        let parts =
            n(&t["used_ns"]) + n(&t["steal_ns"]) + n(&t["waiting_ns"]) + n(&t["blocked_ns"]);
        assert_eq!(wall, parts, "identity of {t}");
        assert!(n(&t["used_ns"]) > 0, "{t}");
        assert!(t["host_tid"].as_i64().unwrap() > 0, "{t}");
    }
}

#[test]
fn transmitted_frames_reach_the_tap_exactly_and_every_frame_is_counted() {
    let _g = common::serial();
    let ns = NetNs::new(false);
    let before = ns.tap_counter("rx_packets");
    let mut vmm = Vmm::start_in(
        &ns.name,
        "net-tx",
        &[
            "--net",
            "tap=tap0",
            "--workload",
            "net-tx:packets=100000,size=64",
        ],
    );
    let (code, r) = vmm.wait();
    assert_eq!(code, 0, "{r}");
    let sent_by_guest = n(&r["vcpus"][0]["guest_reported"]["net_sent"]);
    let dev = device(&r);
    let tx = queue(dev, 1);
    assert_eq!(tx["kind"], "tx");
    assert_eq!(sent_by_guest, 100_000, "the guest got every frame back");
    assert_eq!(n(&tx["chains"]), 100_000);
    assert_eq!(n(&tx["packets"]) + drops(tx), 100_000, "{tx}");
    assert_eq!(n(&tx["bytes"]), 64 * n(&tx["packets"]));
    // The tap's own count of what it received from the VMM.
    assert_eq!(ns.tap_counter("rx_packets") - before, n(&tx["packets"]));
    assert_eq!(dev["status"], "ok");
    assert_eq!(n(&dev["driver"]["activations"]), 1);
    assert_threads(dev);
    let cpu = &dev["cpu"];
    assert!(
        n(&cpu["tx"]) > 0 && n(&dev["cpu_ns_per_packet"]["tx"]) > 0,
        "{dev}"
    );
    assert!(n(&dev["cpu_ns"]) >= n(&cpu["tx"]) + n(&cpu["rx"]) + n(&cpu["ctrl"]));
    let host = &r["vm"]["host_cpu_ns"];
    assert_eq!(n(&host["devices"]), n(&dev["cpu_ns"]));
    assert!(n(&host["vcpus"]) > 0 && n(&host["service"]) > 0, "{host}");
}

#[test]
fn frames_from_the_host_reach_the_guest_and_every_one_is_accounted() {
    let _g = common::serial();
    let ns = NetNs::new(false);
    let vmm = Vmm::start_in(
        &ns.name,
        "net-rx",
        &[
            "--net",
            "tap=tap0",
            "--workload",
            "net-rx:packets=10000,ms=60000",
        ],
    );
    vmm.wait_driver("net0");
    let passed_before = ns.tap_counter("tx_packets");
    // At most 512 frames ahead of the guest: every frame gets to the VMM.
    let sent = ns.send_paced(vmm.sock.clone(), 10_000, 512);
    assert_eq!(sent, 10_000);
    let mut vmm = vmm;
    let (code, r) = vmm.wait();
    assert_eq!(code, 0, "{r}");
    let got = n(&r["vcpus"][0]["guest_reported"]["net_received"]);
    let dev = device(&r);
    let rx = queue(dev, 0);
    assert_eq!(rx["kind"], "rx");
    // What the guest counted is what the device delivered.
    assert_eq!(got, n(&rx["packets"]), "{rx}");
    // What the tap passed on was delivered or dropped with a reason.
    let passed = ns.tap_counter("tx_packets") - passed_before;
    assert_eq!(n(&rx["packets"]) + drops(rx), passed, "{rx}");
    // Paced, nothing was dropped on the way.
    assert_eq!(passed, 10_000, "{rx}");
    assert_eq!(got, 10_000, "{rx}");
    assert_threads(dev);
    assert!(n(&dev["cpu_ns_per_packet"]["rx"]) > 0, "{dev}");
}

#[test]
fn the_guest_echoes_frames_back_to_their_sender() {
    let _g = common::serial();
    let ns = NetNs::new(false);
    let vmm = Vmm::start_in(
        &ns.name,
        "net-echo",
        &["--net", "tap=tap0", "--workload", "net-echo:ms=4000"],
    );
    vmm.wait_driver("net0");
    let (sent, echoed) = ns.within(|| {
        let s = PacketSocket::open("tap0", 2000).expect("a packet socket on the tap");
        let mut buf = [0u8; 2048];
        let mut echoed = 0u64;
        for seq in 0..200u64 {
            let f = test_frame([0xff; 6], s.mac, 100, seq);
            assert!(s.send(&f));
            // Our own frame comes back to us first on a packet socket bound to the tap: look
            // for the one addressed to us with our sequence number.
            while let Some(len) = s.recv(&mut buf) {
                let e = &buf[..len];
                if len >= 22
                    && e[..6] == s.mac
                    && e[12..14] == [0x88, 0xb5]
                    && e[14..22] == seq.to_le_bytes()
                {
                    echoed += 1;
                    break;
                }
            }
        }
        (200u64, echoed)
    });
    let mut vmm = vmm;
    let (code, r) = vmm.wait();
    assert_eq!(code, 0, "{r}");
    let g = &r["vcpus"][0]["guest_reported"];
    assert_eq!(echoed, sent, "every frame came back");
    assert_eq!(n(&g["net_echoed"]), sent);
    assert_eq!(n(&g["net_received"]), sent);
    let dev = device(&r);
    assert_eq!(n(&queue(dev, 0)["packets"]), sent);
    assert_eq!(n(&queue(dev, 1)["packets"]), sent);
}

#[test]
fn a_tap_that_disappears_is_counted_not_a_crash() {
    let _g = common::serial();
    let ns = NetNs::new(false);
    let vmm = Vmm::start_in(
        &ns.name,
        "net-gone",
        &[
            "--net",
            "tap=tap0",
            "--workload",
            "net-tx:packets=2000000,size=64",
        ],
    );
    vmm.wait_driver("net0");
    std::thread::sleep(Duration::from_millis(300));
    ns.delete_tap();
    let mut vmm = vmm;
    let (code, r) = vmm.wait();
    assert_eq!(code, 0, "{r}");
    let tx = queue(device(&r), 1);
    let down = tx["drops"]["tap_down"].as_u64().unwrap_or(0);
    assert!(
        down > 0,
        "frames after the tap went are dropped as tap_down: {tx}"
    );
    assert_eq!(
        n(&tx["packets"]) + drops(tx),
        n(&r["vcpus"][0]["guest_reported"]["net_sent"]),
        "{tx}"
    );
}

#[test]
fn bad_net_values_are_refused_before_any_vcpu_runs() {
    common::require_kvm();
    for (args, says) in [
        (vec!["--net", "tap=a/b"], "is not a usable interface name"),
        (
            vec!["--net", "tap=t,queues=2"],
            "queue pairs but the VM has 1 vCPUs",
        ),
        (
            vec!["--net", "tap=t,mac=01:00:00:00:00:01"],
            "is not a unicast MAC address",
        ),
        (vec!["--net", "mac=02:00:00:00:00:01"], "needs tap=NAME"),
        (vec!["--net", "tap=t,speed=10"], "has no key `speed`"),
        (
            vec!["--net", "tap=t,rate=tx-bytes:0/1s"],
            "`0` is not a size",
        ),
        (
            vec!["--net", "tap=t,rate=ops:1/1s"],
            "`ops` is not something this device limits",
        ),
        (
            vec!["--workload", "net-tx"],
            "need a device to drive: add --net",
        ),
        (
            vec!["--vcpus", "2", "--net", "tap=t", "--workload", "net-rx"],
            "run on one vCPU of the tiny guest",
        ),
    ] {
        let out = std::process::Command::new(bin())
            .arg("run")
            .args(&args)
            .args(["--report", "none"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("tiny:"), "no vCPU ran: {err}");
    }
}

#[test]
fn with_two_queue_pairs_a_driver_without_mq_gets_every_frame_on_the_first_pair() {
    let _g = common::serial();
    let ns = NetNs::new(true);
    let vmm = Vmm::start_in(
        &ns.name,
        "net-mq",
        &[
            "--vcpus",
            "2",
            "--net",
            "tap=tap0,queues=2",
            "--workload",
            "0=net-rx:packets=2000,ms=60000",
            "--workload",
            "1=idle:ms=100",
        ],
    );
    vmm.wait_driver("net0");
    let sock = vmm.sock.clone();
    ns.within(move || {
        let s = PacketSocket::open("tap0", 100).expect("a packet socket on the tap");
        let mut c = common::vmm::Conn::new(std::os::unix::net::UnixStream::connect(&sock).unwrap());
        let mut sent = 0u64;
        while sent < 2000 {
            let d = c.ok(json!({"cmd": "device", "name": "net0"}));
            if sent >= n(&d["queues"][0]["packets"]) + 256 {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            // Different flows, so that an attached second queue would be given some.
            let mut f = test_frame([0xff; 6], s.mac, 64, sent);
            f[6] = (sent % 251) as u8 & 0xfe;
            if s.send(&f) {
                sent += 1;
            }
        }
    });
    let mut vmm = vmm;
    let (code, r) = vmm.wait();
    assert_eq!(code, 0, "{r}");
    let dev = device(&r);
    let queues = dev["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 5, "rx0 tx0 rx1 tx1 ctrl: {dev}");
    assert_eq!(queues[4]["kind"], "ctrl");
    assert_eq!(n(&queue(dev, 0)["packets"]), 2000, "{dev}");
    assert_eq!(
        n(&queue(dev, 2)["packets"]) + drops(queue(dev, 2)),
        0,
        "{dev}"
    );
    assert_eq!(n(&r["vcpus"][0]["guest_reported"]["net_received"]), 2000);
    assert_eq!(dev["threads"].as_array().unwrap().len(), 2);
    assert_threads(dev);
}

/// Each device thread's CPU in `device` agrees with its own schedstat (read from /proc just
/// before and just after the request), to 1 % or 200 µs.
#[test]
fn a_device_threads_cpu_is_its_own_schedstat() {
    let _g = common::serial();
    let ns = NetNs::new(false);
    let vmm = Vmm::start_in(
        &ns.name,
        "net-cpu",
        &[
            "--net",
            "tap=tap0",
            "--workload",
            "net-tx:packets=3000000,size=64",
        ],
    );
    vmm.wait_driver("net0");
    std::thread::sleep(Duration::from_millis(300));
    let mut c = vmm.connect();
    let tid = c.ok(json!({"cmd": "threads"}))["devices"][0]["host_tid"]
        .as_i64()
        .unwrap();
    let path = format!("/proc/{}/task/{tid}/schedstat", vmm.pid());
    let exec = || -> u64 {
        std::fs::read_to_string(&path)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let before = exec();
    let d = c.ok(json!({"cmd": "device", "name": "net0"}));
    let after = exec();
    let used = n(&d["threads"][0]["used_ns"]);
    let slack = (after / 100).max(200_000);
    assert!(
        used + slack >= before && used <= after + slack,
        "used_ns {used} against schedstat {before}..{after}"
    );
    // The frames go through the thread's io_uring (where the kernel gives one), and none of
    // its writes went to an io_uring worker thread, whose CPU the device's figures would miss.
    let pid = vmm.pid();
    let rings = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy() == "anon_inode:[io_uring]")
        .count();
    let uring_off = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .is_ok_and(|s| s.trim() != "0");
    assert!(
        rings == 1 || uring_off,
        "{rings} io_urings for one queue pair"
    );
    let workers: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|c| c.starts_with("iou-"))
        .collect();
    assert!(workers.is_empty(), "io_uring workers: {workers:?}");
    vmm.shutdown();
}

/// `ppa-vmm run ARGS --report none` inside `ns`: its exit code and stderr.
fn run_in(ns: &NetNs, args: &[&str]) -> (Option<i32>, String) {
    let out = ns
        .command(bin())
        .arg("run")
        .args(args)
        .args(["--report", "none"])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn what_is_wrong_with_the_named_tap_is_said_before_any_vcpu_runs() {
    let _g = common::serial();
    common::require_kvm();
    let ns = NetNs::new(true);
    // Not a tap at all: the namespace's loopback; a veth pair.
    let veth = ns
        .command("ip")
        .args([
            "link", "add", "vth0", "type", "veth", "peer", "name", "vth1",
        ])
        .status()
        .unwrap();
    assert!(veth.success());
    for (args, says) in [
        (
            vec!["--net", "tap=lo"],
            "lo is not a tap (not a tun or tap device)",
        ),
        (vec!["--net", "tap=vth0"], "vth0 is not a tap"),
        // tap0 was made with multi_queue; one queue pair is asked.
        (
            vec!["--net", "tap=tap0"],
            "the tap tap0 was made with multi_queue and --net asks for 1 queue pair(s)",
        ),
    ] {
        let (code, err) = run_in(&ns, &args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("tiny:"), "no vCPU ran: {err}");
    }
    // The reverse: a tap without multi_queue, two pairs asked.
    let single = ns
        .command("ip")
        .args(["tuntap", "add", "dev", "tap1", "mode", "tap", "vnet_hdr"])
        .status()
        .unwrap();
    assert!(single.success());
    let (code, err) = run_in(&ns, &["--vcpus", "2", "--net", "tap=tap1,queues=2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(
            "the tap tap1 was made without multi_queue and --net asks for 2 queue pair(s)"
        ),
        "{err}"
    );
    // An MTU above the tap's: the tap is raised to it (this VMM may: root).
    let (code, err) = run_in(
        &ns,
        &["--net", "tap=tap1,mtu=9000", "--workload", "idle:ms=10"],
    );
    assert_eq!(code, Some(0), "{err}");
    let mtu = ns
        .command("cat")
        .arg("/sys/class/net/tap1/mtu")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&mtu.stdout).trim(), "9000");
}

#[test]
fn a_second_vmm_on_a_multi_queue_tap_another_vmm_reads_is_refused() {
    let _g = common::serial();
    let ns = NetNs::new(true);
    let vmm = Vmm::start_in(
        &ns.name,
        "net-first",
        &[
            "--vcpus",
            "2",
            "--net",
            "tap=tap0,queues=2",
            "--workload",
            "0=net-rx:packets=1,ms=60000",
            "--workload",
            "1=idle:ms=60000",
        ],
    );
    vmm.wait_driver("net0");
    // The kernel would hand it queues of its own and split the tap's frames between the two.
    let (code, err) = run_in(&ns, &["--vcpus", "2", "--net", "tap=tap0,queues=2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("the tap tap0 already has 2 queue(s) of another process"),
        "{err}"
    );
    let mut vmm = vmm;
    vmm.connect().ok(json!({"cmd": "shutdown"}));
    let (code, _) = vmm.wait();
    assert_eq!(code, 0);
}

#[test]
fn a_deleted_tap_is_reported_gone_in_the_device_figures() {
    let _g = common::serial();
    let ns = NetNs::new(false);
    let vmm = Vmm::start_in(
        &ns.name,
        "net-gone-said",
        &[
            "--net",
            "tap=tap0",
            "--workload",
            "net-tx:packets=2000000,size=64",
        ],
    );
    vmm.wait_driver("net0");
    let mut c = vmm.connect();
    let d = c.ok(json!({"cmd": "device", "name": "net0"}));
    assert!(d.get("backend_error").is_none(), "{d}");
    ns.delete_tap();
    let mut said = None;
    for _ in 0..400 {
        let d = c.ok(json!({"cmd": "device", "name": "net0"}));
        if let Some(e) = d["backend_error"].as_str() {
            said = Some(e.to_string());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let said = said.expect("the device says its tap is gone");
    assert!(said.contains("its tap tap0 is gone or down"), "{said}");
    drop(c);
    let mut vmm = vmm;
    let (code, r) = vmm.wait();
    assert_eq!(code, 0, "{r}");
}
