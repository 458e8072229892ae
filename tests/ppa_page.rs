//! The PPA page's host section, read as a host tool would: by mapping `--ppa-page-file`.

mod common;

use std::os::fd::AsRawFd;
use std::time::Duration;

use common::vmm::Vmm;
use ppa_guest_abi::ppa_page::{read_record, HostVcpu, RegionHeader, MAJOR, REGION_MAGIC};
use serde_json::{json, Value};

#[test]
fn the_host_section_matches_stats_and_keeps_being_refreshed() {
    let _g = common::serial();
    let mut vmm = Vmm::with_page("page", &["--vcpus", "3", "--workload", "busy:ms=60000"]);
    let file = vmm.page();
    let mut c = vmm.connect();
    // Long enough that 1 % of wall (the live identity's tolerance) is well above the
    // one-off start costs.
    std::thread::sleep(Duration::from_millis(1500));

    let f = std::fs::File::open(&file).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    assert_eq!(len, 64 * 1024, "the default size");
    // SAFETY: a read-only shared mapping of the whole file, unmapped below.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    // SAFETY: the header is at offset 0 of a mapping of 64 KiB, written before the VM started.
    let h: RegionHeader = unsafe { std::ptr::read_volatile(base.cast()) };
    assert_eq!((h.magic, h.major, h.host_count), (REGION_MAGIC, MAJOR, 3));
    assert_eq!(h.total_size as usize, len);

    let mut stats = || c.ok(json!({"cmd": "stats"}));
    let mut prev_wall = [0u64; 3];
    for _ in 0..5 {
        let recs: Vec<HostVcpu> = (0..3)
            .map(|i| {
                let off = h.host_offset as usize + i * h.host_record_size as usize;
                // SAFETY: the record lies inside the mapping (checked by the VMM's layout);
                // the VMM writes it under the sequence protocol.
                unsafe { read_record(base.cast::<u8>().add(off).cast::<HostVcpu>(), 16) }
                    .expect("a consistent copy")
            })
            .collect();
        let s = stats();
        for (i, rec) in recs.iter().enumerate() {
            let v = &s["vcpus"][i];
            let g = |k: &str| v[k].as_u64().unwrap();
            assert_eq!(rec.vcpu as usize, i);
            assert!(rec.wall_ns > 0, "refreshed: {rec:?}");
            // The record (refreshed every 10 ms) and the stats snapshot (up to 15 ms old) were
            // taken at slightly different times: used differs by at most the wall time between
            // them. Steal (schedstat run_delay) only moves when the waiting thread gets a CPU,
            // so it may also lag by one run-queue wait (under 30 ms for 3 vCPUs on 2 CPUs).
            let gap = g("wall_ns").abs_diff(rec.wall_ns);
            // Refreshed: each sample (100 ms apart) shows a later record than the last.
            assert!(
                rec.wall_ns > prev_wall[i],
                "vCPU {i}: the record did not move"
            );
            prev_wall[i] = rec.wall_ns;
            for (k, x, slack) in [
                ("used_ns", rec.used_ns, 1_000_000),
                ("steal_ns", rec.steal_ns, 30_000_000),
            ] {
                assert!(
                    g(k).abs_diff(x) <= gap + slack,
                    "vCPU {i} {k}: record {x}, stats {} ({gap} ns apart)",
                    g(k)
                );
            }
            // The record holds the identity on its own.
            let sum = rec.used_ns
                + rec.steal_ns
                + rec.halted_ns
                + rec.idle_ns
                + rec.limited_ns
                + rec.paused_ns;
            assert!(
                rec.wall_ns.abs_diff(sum) <= rec.wall_ns / 100,
                "vCPU {i}: {rec:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: the mapping made above, not used after this.
    unsafe { libc::munmap(base, len) };
    vmm.connect().ok(json!({"cmd": "shutdown"}));
    let (code, _) = vmm.wait();
    assert_eq!(code, 0);
    assert!(!file.exists(), "the file goes with the VM");
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
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    let guest_offset = 64 + 2 * 128;
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
