//! virtio-blk end to end on this host, with the tiny guest's polled driver, on files in a
//! private temporary directory. Each test counts the same requests three ways where it can:
//! what the guest counted, what the device counted, and what the file holds afterwards.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::vmm::{bin, temp_dir, Vmm};
use ppa_guest_abi::{blk_pattern, BLK_BLOCK};
use serde_json::{json, Value};

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Runs `ppa-vmm run --report json ARGS` to its end.
fn run(args: &[&str]) -> (i32, Value, String) {
    common::require_kvm();
    let out: Output = Command::new(bin())
        .args(["run", "--report", "json", "--max-runtime", "120"])
        .args(args)
        .output()
        .expect("ppa-vmm runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), report, stderr)
}

/// A zeroed file of `mib` MiB.
fn disk_file(dir: &Path, name: &str, mib: u64) -> String {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(mib << 20).unwrap();
    p.display().to_string()
}

/// Blocks of `path` that do not hold their pattern, among `0..blocks`.
fn wrong_blocks(path: &str, blocks: u64) -> Vec<u64> {
    let bytes = std::fs::read(path).unwrap();
    (0..blocks)
        .filter(|&b| {
            let block = &bytes[(b * BLK_BLOCK) as usize..((b + 1) * BLK_BLOCK) as usize];
            block
                .chunks_exact(8)
                .enumerate()
                .any(|(w, c)| u64::from_le_bytes(c.try_into().unwrap()) != blk_pattern(b, w as u64))
        })
        .collect()
}

/// The guest's reported value `key`.
fn guest(r: &Value, key: &str) -> u64 {
    n(&r["vcpus"][0]["guest_reported"][key])
}

/// Requests of `kind` the device counted.
fn requests(dev: &Value, kind: &str) -> u64 {
    dev["blk"]["requests"][kind].as_u64().unwrap_or(0)
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
        assert_eq!(t["name"], "blk0-q0");
    }
}

#[test]
fn written_blocks_land_at_their_offsets_read_back_whole_and_every_request_is_counted() {
    let _g = common::serial();
    let dir = temp_dir("blk-rw");
    let path = disk_file(dir.as_path(), "disk.img", 4);
    let disk = format!("path={path}");
    let (code, r, err) = run(&[
        "--disk",
        &disk,
        "--workload",
        "blk-write:blocks=512,depth=16",
    ]);
    assert_eq!(code, 0, "{err}");
    let dev = &r["devices"][0];
    assert_eq!(
        (guest(&r, "blk_blocks"), guest(&r, "blk_errors")),
        (512, 0),
        "{r}"
    );
    assert_eq!(
        wrong_blocks(&path, 512),
        Vec::<u64>::new(),
        "the file holds the pattern"
    );
    let rest = std::fs::read(&path).unwrap();
    assert!(
        rest[512 * 4096..].iter().all(|b| *b == 0),
        "nothing past the last block"
    );
    assert_eq!(
        (dev["kind"].as_str(), dev["status"].as_str()),
        (Some("blk"), Some("ok"))
    );
    assert_eq!(requests(dev, "write"), guest(&r, "blk_blocks"));
    assert_eq!(requests(dev, "flush"), 1);
    assert_eq!(n(&dev["blk"]["bytes_written"]), 512 * 4096);
    let q = &dev["queues"][0];
    assert_eq!(
        (q["kind"].as_str(), n(&q["requests"]), n(&q["chains"])),
        (Some("req"), 513, 513)
    );
    assert!(n(&q["notifications"]) >= 1, "{q}");
    assert_eq!(n(&dev["service"]["write"]["count"]), 512);
    assert_eq!(n(&dev["service"]["flush"]["count"]), 1);
    assert_threads(dev);
    assert!(
        n(&dev["cpu"]["req"]) > 0 && n(&dev["cpu_ns"]) >= n(&dev["cpu"]["req"]),
        "{dev}"
    );
    assert_eq!(n(&r["vm"]["host_cpu_ns"]["devices"]), n(&dev["cpu_ns"]));

    let (code, r, err) = run(&["--disk", &disk, "--workload", "blk-verify:blocks=512"]);
    assert_eq!(code, 0, "{err}");
    let dev = &r["devices"][0];
    assert_eq!(
        (
            guest(&r, "blk_blocks"),
            guest(&r, "blk_mismatches"),
            guest(&r, "blk_errors")
        ),
        (512, 0, 0)
    );
    assert_eq!(requests(dev, "read"), 512);
    assert_eq!(n(&dev["blk"]["bytes_read"]), 512 * 4096);

    // A block changed behind the guest's back is seen: the check is not vacuous.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[7 * 4096 + 100] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let (code, r, err) = run(&["--disk", &disk, "--workload", "blk-verify:blocks=512"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(guest(&r, "blk_mismatches"), 1);

    // Two sectors of block 9 swapped: both checks see it; `check=sectors` (what `bench disk`
    // runs) does not look inside a sector, so block 7's changed byte is the full check's only.
    let (a, b) = (9 * 4096 + 512, 9 * 4096 + 1024);
    let (first, second) = (bytes[a..a + 512].to_vec(), bytes[b..b + 512].to_vec());
    bytes[a..a + 512].copy_from_slice(&second);
    bytes[b..b + 512].copy_from_slice(&first);
    std::fs::write(&path, &bytes).unwrap();
    // With one request in flight nothing can merge; with 32 a read may join the one before.
    for (check, depth, mismatches) in [("all", 32, 2), ("sectors", 1, 1)] {
        let w = format!("blk-verify:blocks=512,depth={depth},check={check}");
        let (code, r, err) = run(&["--disk", &disk, "--workload", &w]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(guest(&r, "blk_mismatches"), mismatches, "check={check}");
        let merged = n(&r["devices"][0]["blk"]["merged"]);
        assert!(merged < 512, "{merged} merged of 512");
        if depth == 1 {
            assert_eq!(merged, 0, "one in flight");
        }
    }
}

/// `poll_us=`: the same requests answered with the same data, the polling's CPU a part of
/// its own (`cpu.poll`) and the parts adding up to the thread's CPU; without it, no polling.
#[test]
fn a_polling_disk_answers_the_same_and_accounts_its_polling_apart() {
    let _g = common::serial();
    let dir = temp_dir("blk-poll");
    let path = disk_file(dir.as_path(), "disk.img", 4);
    for poll in [0, 200] {
        let disk = format!("path={path},poll_us={poll}");
        for w in ["blk-write:blocks=256", "blk-verify:blocks=256"] {
            let (code, r, err) = run(&["--disk", &disk, "--workload", w]);
            assert_eq!(code, 0, "{err}");
            assert_eq!(
                (
                    guest(&r, "blk_blocks"),
                    guest(&r, "blk_errors"),
                    guest(&r, "blk_mismatches")
                ),
                (256, 0, 0),
                "{w} poll_us={poll}"
            );
            let dev = &r["devices"][0];
            let cpu = &dev["cpu"];
            assert_eq!(
                n(&cpu["req"]) + n(&cpu["poll"]) + n(&cpu["other"]),
                n(&dev["cpu_ns"]),
                "{cpu}"
            );
            if poll == 0 {
                assert_eq!(n(&cpu["poll"]), 0, "{w}");
            } else {
                assert!(n(&cpu["poll"]) > 0, "{w}: {cpu}");
            }
        }
    }
    assert_eq!(wrong_blocks(&path, 256), Vec::<u64>::new());
}

#[test]
fn a_read_only_disk_refuses_writes_with_ioerr_and_the_vm_goes_on() {
    let _g = common::serial();
    let dir = temp_dir("blk-ro");
    let path = disk_file(dir.as_path(), "disk.img", 1);
    let disk = format!("path={path},readonly=on");
    let (code, r, err) = run(&[
        "--vcpus",
        "2",
        "--disk",
        &disk,
        "--workload",
        "blk-write:blocks=64",
        "--workload",
        "1=busy:ms=200",
    ]);
    assert_eq!(code, 0, "{err}");
    // Every write answered IOERR; the FLUSH (nothing to flush) OK.
    assert_eq!(
        (guest(&r, "blk_blocks"), guest(&r, "blk_errors")),
        (0, 64),
        "{r}"
    );
    let dev = &r["devices"][0];
    assert_eq!(n(&dev["blk"]["errors"]["ioerr"]), 64);
    assert_eq!((requests(dev, "write"), requests(dev, "flush")), (64, 1));
    assert_eq!(n(&dev["blk"]["bytes_written"]), 0);
    assert_eq!(
        n(&dev["blk"]["merged"]),
        0,
        "a write refused by its checks never merges"
    );
    assert_eq!(dev["blk"]["readonly"], true);
    assert_eq!(dev["status"], "ok", "an error status, not a stopped device");
    assert!(err.contains("read-only disk"), "logged: {err}");
    assert!(
        std::fs::read(&path).unwrap().iter().all(|b| *b == 0),
        "the file is untouched"
    );
    for v in r["vcpus"].as_array().unwrap() {
        assert_eq!((&v["end"], &v["exit_code"]), (&json!("exited"), &json!(0)));
    }
    // Reads still work.
    let (code, r, _) = run(&["--disk", &disk, "--workload", "blk-verify:blocks=8"]);
    assert_eq!(code, 0);
    assert_eq!(
        (guest(&r, "blk_blocks"), guest(&r, "blk_mismatches")),
        (8, 8),
        "zeros, not the pattern"
    );
}

#[test]
fn a_disk_one_vmm_may_write_is_never_opened_by_another() {
    let _g = common::serial();
    let dir = temp_dir("blk-lock");
    let path = disk_file(dir.as_path(), "disk.img", 1);
    let rw = format!("path={path}");
    let ro = format!("path={path},readonly=on");
    let first = Vmm::start("blk-lock", &["--disk", &rw, "--workload", "idle:ms=20000"]);
    for disk in [&rw, &ro] {
        let (code, _, err) = run(&["--disk", disk, "--workload", "busy:ms=1"]);
        assert_eq!(code, 2, "refused before anything runs: {err}");
        assert!(
            err.contains("is in use") && err.contains("for writing"),
            "{err}"
        );
    }
    let (code, _) = first.shutdown();
    assert_eq!(code, 0);
    // Two readers share it; a writer is then refused.
    let reader = Vmm::start(
        "blk-lock-ro",
        &["--disk", &ro, "--workload", "idle:ms=20000"],
    );
    let (code, _, err) = run(&["--disk", &ro, "--workload", "busy:ms=1"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&["--disk", &rw, "--workload", "busy:ms=1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("for reading"), "{err}");
    reader.shutdown();
}

/// `cachestat(2)` over the whole file: (pages cached, dirty, under writeback).
fn cachestat(path: &str) -> (u64, u64, u64) {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    let f = std::fs::File::open(path).unwrap();
    let range = Range { off: 0, len: 0 };
    let mut st = Stat::default();
    // SAFETY: cachestat (x86_64 number 451) reads the range and writes the stat, both ours.
    let r = unsafe {
        libc::syscall(
            451,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            &range as *const Range,
            &mut st as *mut Stat,
            0,
        )
    };
    assert_eq!(r, 0, "cachestat: {}", std::io::Error::last_os_error());
    (st.cache, st.dirty, st.writeback)
}

#[test]
fn a_flushed_write_is_in_the_file_after_a_sigkill_right_after_the_flush() {
    let _g = common::serial();
    let dir = temp_dir("blk-kill");
    let path = disk_file(dir.as_path(), "disk.img", 4);
    let disk = format!("path={path}");
    let vmm = Vmm::start(
        "blk-kill",
        &[
            "--disk",
            &disk,
            "--workload",
            "blk-write:blocks=256,hold_ms=60000",
        ],
    );
    let mut c = vmm.connect();
    let mut flushed = false;
    for _ in 0..4000 {
        let d = c.ok(json!({"cmd": "device", "name": "blk0"}));
        if requests(&d, "flush") == 1 {
            flushed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(flushed, "the guest's FLUSH was answered");
    // SIGKILL at once: nothing of the VMM's may be needed for the data to be there.
    // SAFETY: kill(2) on the VMM child this test started.
    assert_eq!(unsafe { libc::kill(vmm.pid() as i32, libc::SIGKILL) }, 0);
    drop(vmm);
    assert_eq!(wrong_blocks(&path, 256), Vec::<u64>::new());
    // And not only in the page cache: the FLUSH was an fdatasync, so no page of the file is
    // dirty or still being written back (a write left to the kernel stays dirty for 30 s).
    let (cached, dirty, writeback) = cachestat(&path);
    assert!(cached > 0, "the pages are cached");
    assert_eq!(
        (dirty, writeback),
        (0, 0),
        "every flushed page reached the disk"
    );
}

#[test]
fn stats_the_device_command_the_text_report_and_the_metrics_show_the_disk() {
    let _g = common::serial();
    let dir = temp_dir("blk-views");
    let path = disk_file(dir.as_path(), "disk.img", 4);
    let disk = format!("path={path},id=data");
    let vmm = Vmm::with_report(
        "blk-views",
        "text",
        &[
            "--disk",
            &disk,
            "--workload",
            "blk-write:blocks=64,hold_ms=60000",
        ],
    );
    let mut c = vmm.connect();
    let mut d = Value::Null;
    for _ in 0..4000 {
        d = c.ok(json!({"cmd": "device", "name": "data"}));
        if requests(&d, "flush") == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        (requests(&d, "write"), requests(&d, "flush")),
        (64, 1),
        "{d}"
    );
    let stats = c.ok(json!({"cmd": "stats"}));
    assert_eq!(stats["devices"][0]["id"], "data");
    assert_eq!(stats["devices"][0]["blk"]["requests"]["write"], 64);
    let threads = c.ok(json!({"cmd": "threads"}));
    assert!(threads.to_string().contains("data-q0"), "{threads}");
    let m = c.ok(json!({"cmd": "metrics"}));
    let m = m
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| m.to_string());
    assert!(
        m.contains("ppa_device_requests_total{") && m.contains("type=\"write\"} 64"),
        "{m}"
    );
    assert!(
        m.contains("ppa_device_request_service_seconds_bucket{"),
        "{m}"
    );
    let out = vmm.shutdown_output();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("data "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(" 64 ") && line.ends_with(&path), "{line}");
    assert!(
        text.contains("service us p50/p99/max (requests): write "),
        "{text}"
    );
}

#[test]
fn a_rate_limited_disk_loses_nothing_and_never_passes_its_rate() {
    let _g = common::serial();
    let dir = temp_dir("blk-rate");
    let path = disk_file(dir.as_path(), "disk.img", 4);
    // 100 requests and 1 MiB a 100 ms: 513 requests (512 writes of 4 KiB and a flush) take at
    // least 0.4 s beyond the full buckets, where the disk alone takes a few ms.
    let disk = format!("path={path},rate=ops:100/100ms+bytes:1Mi/100ms");
    let t0 = std::time::Instant::now();
    let (code, r, err) = run(&[
        "--disk",
        &disk,
        "--workload",
        "blk-write:blocks=512,depth=16",
    ]);
    let elapsed = t0.elapsed();
    assert_eq!(code, 0, "{err}");
    assert_eq!(wrong_blocks(&path, 512), Vec::<u64>::new(), "nothing lost");
    let dev = &r["devices"][0];
    assert_eq!(dev["rate"], "bytes:1048576/100ms+ops:100/100ms", "{dev}");
    let q = &dev["queues"][0];
    assert_eq!((n(&q["requests"]), n(&q["chains"])), (513, 513), "{q}");
    let most = |size: f64| size + size * elapsed.as_secs_f64() / 0.1;
    assert!(
        513.0 <= most(100.0),
        "513 requests in {elapsed:?} is more than the rate lets through"
    );
    assert!(n(&q["throttles"]) > 0, "{q}");
    let waited = n(&q["throttled_ns"]);
    assert!(waited > 0 && waited < elapsed.as_nanos() as u64, "{q}");
    eprintln!(
        "513 requests in {elapsed:?} ({:.0}/s of 1000/s, the bucket's 100 included), waited {} ms in {} stops",
        513.0 / elapsed.as_secs_f64(),
        waited / 1_000_000,
        n(&q["throttles"])
    );
    assert_threads(dev);
}
