//! The PPA page's host section, read as a host tool would: by mapping `--ppa-page-file`. How
//! close its figures come to `stats` is the accuracy target's (tests/accuracy/socket.rs).

mod common;

use std::time::Duration;

use common::page::HostSection;
use common::vmm::Vmm;
use ppa_guest_abi::ppa_page::{MAJOR, REGION_MAGIC};
use serde_json::{json, Value};

#[test]
fn the_host_section_is_mapped_by_a_host_tool_and_keeps_being_refreshed() {
    let _g = common::serial();
    let mut vmm = Vmm::with_page("page", &["--vcpus", "3", "--workload", "busy:ms=60000"]);
    let file = vmm.page();
    std::thread::sleep(Duration::from_millis(300));

    let page = HostSection::map(&file);
    assert_eq!(page.len(), 64 * 1024, "the default size");
    let h = page.header;
    assert_eq!((h.magic, h.major, h.host_count), (REGION_MAGIC, MAJOR, 3));
    assert_eq!(h.total_size as usize, page.len());

    let mut prev_wall = [0u64; 3];
    for _ in 0..5 {
        for (i, prev) in prev_wall.iter_mut().enumerate() {
            let rec = page.record(i);
            assert_eq!(rec.vcpu as usize, i);
            // Level basic measures neither (1.4: u64::MAX, not zero).
            assert_eq!(rec.kvm(h.minor), None, "{rec:?}");
            assert_eq!(rec.interrupted(h.minor), None, "{rec:?}");
            // Refreshed: each sample (100 ms apart) shows a later record than the last.
            assert!(
                rec.wall_ns > *prev,
                "vCPU {i}: the record did not move: {rec:?}"
            );
            *prev = rec.wall_ns;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(page);
    vmm.connect().ok(json!({"cmd": "shutdown"}));
    let (code, _) = vmm.wait();
    assert_eq!(code, 0);
    assert!(!file.exists(), "the file goes with the VM");
}

/// At level full the host record carries the host's interrupts on the vCPU's thread (and
/// KVM's in-kernel time where KVM's tracepoints fire, never under PVM), as `vcpu` gives them.
#[test]
fn at_level_full_the_host_record_carries_interrupted_and_kvm_time_as_measured() {
    let _g = common::serial();
    common::require_tracefs();
    let mut vmm = Vmm::with_page(
        "page-full",
        &[
            "--vcpus",
            "1",
            "--workload",
            "busy:ms=60000",
            "--accounting",
            "full",
        ],
    );
    let file = vmm.page();
    std::thread::sleep(Duration::from_millis(500));
    let page = HostSection::map(&file);
    let minor = page.header.minor;
    assert!(minor >= 3, "layout 1.{minor}");
    let rec = page.record(0);
    let irq = rec.interrupted(minor).expect("interrupted_ns measured");
    assert!(irq > 0 && irq <= rec.used_ns, "{rec:?}");
    assert_eq!(
        rec.guest_ns + rec.kvm(minor).unwrap_or(0) + irq + rec.vmm_ns,
        rec.used_ns,
        "{rec:?}"
    );
    let mut c = vmm.connect();
    let v = c.ok(json!({"cmd": "vcpu", "vcpu": 0}));
    assert_eq!(
        rec.kvm(minor).is_some(),
        v["kvm_ns"].is_u64(),
        "the page and `vcpu` agree on whether kvm_ns is measured: {v}"
    );
    drop(page);
    c.ok(json!({"cmd": "shutdown"}));
    let (code, _) = vmm.wait();
    assert_eq!(code, 0);
}

#[test]
fn the_guest_command_decodes_and_survives_garbage_written_into_the_page() {
    let _g = common::serial();
    // publish=off: the guest leaves the section alone, so only this test writes it.
    let vmm = Vmm::with_page(
        "garbage",
        &["--vcpus", "2", "--workload", "busy:ms=60000,publish=off"],
    );
    let file = vmm.page();
    let mut c = vmm.connect();
    let mut call = |cmd: &str| c.call(json!({ "cmd": cmd }));
    std::thread::sleep(Duration::from_millis(300));
    let g = call("guest");
    assert_eq!(g["ok"], Value::Bool(true), "{g}");
    assert_eq!(g["result"]["page"], Value::Bool(true));
    assert_eq!(
        g["result"]["published"],
        Value::Bool(false),
        "nothing published yet"
    );
    assert_eq!(g["result"]["host"].as_array().unwrap().len(), 2, "{g}");

    // A hostile writer (here through the file; a guest would write the same memory):
    // garbage over the guest section, many times, while the VMM is asked to decode it.
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    // From the region header (layout 1.3 puts the VM record before the guest section).
    let mut word = [0u8; 4];
    f.read_exact_at(&mut word, 28).unwrap();
    let guest_offset = u64::from(u32::from_le_bytes(word));
    assert_eq!(
        guest_offset,
        64 + 3 * 128,
        "two vCPU records and the VM record"
    );
    let mut x = 0x1234_5678_9abc_def0u64;
    let used0 = call("stats")["result"]["vcpus"][0]["used_ns"]
        .as_u64()
        .unwrap();
    for round in 0..50 {
        let mut junk = vec![0u8; 4096];
        for b in junk.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        if round % 2 == 0 {
            // A plausible header with absurd tables.
            junk[4..8].copy_from_slice(b"PPAG");
            junk[0..4].copy_from_slice(&0u32.to_le_bytes());
            junk[8..10].copy_from_slice(&1u16.to_le_bytes());
        }
        f.write_all_at(&junk, guest_offset).unwrap();
        let g = call("guest");
        assert_eq!(g["ok"], Value::Bool(true), "{g}");
    }
    let g = call("guest");
    assert!(
        !g["result"]["errors"].as_array().unwrap().is_empty(),
        "garbage is reported: {g}"
    );
    // The VMM and its vCPUs went on (after the stats snapshot's maximum age, 15 ms, so that
    // this is a new snapshot).
    std::thread::sleep(Duration::from_millis(100));
    let s = call("stats");
    assert!(s["result"]["vcpus"][0]["used_ns"].as_u64().unwrap() > used0);
    assert_eq!(s["result"]["vm"]["state"], Value::from("running"));
    let (code, report) = vmm.shutdown();
    assert_eq!(code, 0);
    assert!(
        report["guest"]["errors"].is_array(),
        "the report has the guest section"
    );
}
