//! Guest RAM on 2 MiB huge pages end to end (issue 36): the test makes its own pool (root
//! writes `nr_hugepages`) and gives it back as it ends, failed or not ([`PoolGuard`]). A pool
//! too small is refused before any vCPU runs with the numbers; a VM on it boots, its RAM is
//! taken from the pool (`free_hugepages` drops by the VM's pages), and the tiny guest's memtouch
//! reads back every word it wrote.

mod common;

use common::{assert_all_exited_ok, reported, serial};

const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

fn read(name: &str) -> u64 {
    std::fs::read_to_string(format!("{POOL}/{name}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The 2 MiB pool as it was, put back on drop.
struct PoolGuard {
    before: u64,
}

impl PoolGuard {
    /// Adds `extra` pages to the pool; None where it cannot be written (not root) or the
    /// kernel could not find them all.
    fn grow(extra: u64) -> Option<PoolGuard> {
        let before = std::fs::read_to_string(format!("{POOL}/nr_hugepages"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let g = PoolGuard { before };
        std::fs::write(format!("{POOL}/nr_hugepages"), (before + extra).to_string()).ok()?;
        (read("nr_hugepages") == before + extra).then_some(g)
    }
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        let _ = std::fs::write(format!("{POOL}/nr_hugepages"), self.before.to_string());
    }
}

fn options(mib: u64, workload: &str) -> ppa_vmm::config::RunOptions {
    ppa_vmm::config::RunOptions {
        vcpus: Some(1),
        memory_mib: Some(mib),
        memory_backing: Some("hugepages=2M".into()),
        workload: vec![workload.into()],
        max_runtime: Some(60.0),
        ..Default::default()
    }
}

#[test]
fn a_vm_on_2m_huge_pages_boots_from_the_pool_and_a_short_pool_is_refused_with_the_numbers() {
    common::require_kvm();
    let _g = serial();
    // Four pages: 8 MiB, short of a 32 MiB VM.
    let Some(small) = PoolGuard::grow(4) else {
        eprintln!("skipped: the 2 MiB huge page pool cannot be grown here (root, {POOL})");
        return;
    };
    let free = read("free_hugepages") - read("resv_hugepages");
    let (config, _) = options(32, "busy:ms=10").into_config().unwrap();
    let err = ppa_vmm::vm::Vm::try_from(config)
        .err()
        .expect("a pool of 8 MiB is refused for 32 MiB")
        .to_string();
    assert!(
        err.contains(&format!("has {free} free")) && err.contains("need 16"),
        "{err}"
    );
    drop(small);
    // Forty pages (80 MiB) for a 64 MiB VM: it takes 32 of them, prefaulted as it is built.
    let _pool = PoolGuard::grow(40).expect("the pool grew a moment ago");
    let free_before = read("free_hugepages");
    let (config, _) = options(64, "memtouch:mib=16").into_config().unwrap();
    let vm = ppa_vmm::vm::Vm::try_from(config).unwrap();
    assert_eq!(
        free_before - read("free_hugepages"),
        32,
        "the VM's 64 MiB are 32 pages of the pool"
    );
    let out = vm.run().unwrap();
    assert_all_exited_ok(&out.report);
    let v = &out.report.vcpus[0];
    assert_eq!(reported(v, "touched_bytes"), 16 << 20);
    assert_eq!(reported(v, "touch_errors"), 0, "every word read back");
    let json = serde_json::to_value(out.report.vm.info.memory).unwrap();
    assert_eq!(json["page_size"], "2M", "{json}");
    // The VM is gone: its pages are back in the pool.
    assert_eq!(read("free_hugepages"), free_before);
}

/// Issue 38 with issue 36: a Firecracker config file's `huge_pages: "2M"` puts the VM's RAM on
/// the 2 MiB pool (the report says so and memtouch reads back every word), and an odd
/// `mem_size_mib` with it is refused with Firecracker's sentence before anything runs.
#[test]
fn firecrackers_huge_pages_2m_backs_the_vm_with_the_pool() {
    common::require_kvm();
    let _g = serial();
    let Some(_pool) = PoolGuard::grow(40) else {
        eprintln!("skipped: the 2 MiB huge page pool cannot be grown here (root, {POOL})");
        return;
    };
    let dir = common::vmm::temp_dir("fc-huge");
    let d = dir.as_path();
    let tiny = d.join("tiny.elf");
    std::fs::write(&tiny, ppa_vmm::payload::tiny::TINY_GUEST).unwrap();
    let report = d.join("report.json");
    let ppa = d.join("ppa.json");
    std::fs::write(
        &ppa,
        serde_json::json!({"report": "json", "report_file": report}).to_string(),
    )
    .unwrap();
    let run = |mib: u64| {
        let cfg = d.join("vm.json");
        std::fs::write(
            &cfg,
            serde_json::json!({
                "boot-source": {"kernel_image_path": tiny,
                                "boot_args": "ppa.workload=memtouch:mib=16"},
                "machine-config": {"vcpu_count": 1, "mem_size_mib": mib, "huge_pages": "2M"},
            })
            .to_string(),
        )
        .unwrap();
        std::process::Command::new(common::vmm::bin())
            .args([
                "firecracker",
                "--no-api",
                "--id",
                "fc-huge",
                "--config-file",
            ])
            .arg(&cfg)
            .arg("--ppa-config")
            .arg(&ppa)
            .arg("--run-dir")
            .arg(d.join("run"))
            .output()
            .unwrap()
    };
    let out = run(65);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("a multiple of 2, and it is 65"), "{err}");
    let out = run(64);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["vm"]["memory"]["page_size"], "2M", "{}", r["vm"]);
    let g = &r["vcpus"][0]["guest_reported"];
    assert_eq!(g["touched_bytes"], 16 << 20, "{g}");
    assert_eq!(g["touch_errors"], 0, "{g}");
}
