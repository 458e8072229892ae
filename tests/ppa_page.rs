//! The PPA page's host section, read as a host tool would: by mapping `--ppa-page-file`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ppa_guest_abi::ppa_page::{read_record, HostVcpu, RegionHeader, MAJOR, REGION_MAGIC};
use serde_json::Value;

#[test]
fn the_host_section_matches_stats_and_keeps_being_refreshed() {
    common::require_kvm();
    let _g = common::serial();
    let dir = std::env::temp_dir().join(format!("ppa-page-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, file) = (dir.join("s"), dir.join("page"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_ppa-vmm"))
        .args(["run", "--vcpus", "3", "--workload", "busy:ms=60000"])
        .args(["--report", "none", "--max-runtime", "60", "--api-sock"])
        .arg(&sock)
        .arg("--ppa-page-file")
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let stream = loop {
        if let Ok(s) = UnixStream::connect(&sock) {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
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

    let mut stats = || -> Value {
        writeln!(w, r#"{{"cmd":"stats"}}"#).unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        serde_json::from_str::<Value>(&line).unwrap()["result"].clone()
    };
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
    writeln!(w, r#"{{"cmd":"shutdown"}}"#).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(!file.exists(), "the file goes with the VM");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_guest_command_decodes_and_survives_garbage_written_into_the_page() {
    common::require_kvm();
    let _g = common::serial();
    let dir = std::env::temp_dir().join(format!("ppa-page-g-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, file) = (dir.join("s"), dir.join("page"));
    let child = Command::new(env!("CARGO_BIN_EXE_ppa-vmm"))
        // publish=off: the guest leaves the section alone, so only this test writes it.
        .args([
            "run",
            "--vcpus",
            "2",
            "--workload",
            "busy:ms=60000,publish=off",
        ])
        .args(["--report", "json", "--max-runtime", "60", "--api-sock"])
        .arg(&sock)
        .arg("--ppa-page-file")
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let stream = loop {
        if let Ok(s) = UnixStream::connect(&sock) {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    let mut call = |cmd: &str| -> Value {
        writeln!(w, r#"{{"cmd":"{cmd}"}}"#).unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    };
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
    call("shutdown");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        report["guest"]["errors"].is_array(),
        "the report has the guest section"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
