//! Firecracker's door without a VM: bodies, resources and their translation, the HTTP layer,
//! the routes and their refusals, the metrics counters, and the API thread over a real socket
//! with a starter that refuses (the VM's own flow is tests/firecracker.rs).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

use ppa_vmm::config::RunOptions;
use ppa_vmm::handle::VmHandle;
use vmm_sys_util::tempdir::TempDir;

use super::api::{Api, Starter};
use super::http::{self, Method, Parsed, Request};
use super::metrics::{self, MetricsState};
use super::model::*;
use super::resources::{self, KernelKind, ResourceError, Resources};

/// A starter that records what it was given and refuses.
#[derive(Default, Clone)]
struct Refuse(Arc<Mutex<Vec<RunOptions>>>);

impl Starter for Refuse {
    fn start(&mut self, options: RunOptions) -> Result<VmHandle, String> {
        self.0.lock().unwrap().push(options);
        Err("the VM could not be built: no KVM here".into())
    }
}

fn tiny_file(dir: &TempDir) -> String {
    let p = dir.as_path().join("tiny.elf");
    std::fs::write(&p, ppa_vmm::payload::tiny::TINY_GUEST).unwrap();
    p.to_string_lossy().into_owned()
}

fn api() -> (Api<Refuse>, Refuse) {
    let r = Refuse::default();
    let a = Api::new(
        "vm_1".into(),
        Resources::default(),
        RunOptions::default(),
        r.clone(),
        Arc::new(Mutex::new(MetricsState::default())),
    );
    (a, r)
}

fn req(method: Method, path: &str, body: &str) -> Request {
    Request {
        method,
        path: path.into(),
        body: body.as_bytes().to_vec(),
    }
}

/// Status and fault message (or body) of a request.
fn call<S: Starter>(a: &mut Api<S>, method: Method, path: &str, body: &str) -> (u16, String) {
    let r = a.handle(&req(method, path, body));
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
    let text = v["fault_message"]
        .as_str()
        .map_or(r.body.clone(), str::to_string);
    (r.status, text)
}

#[test]
fn every_body_refuses_unknown_fields() {
    /// Whether a body is refused.
    type Refused = fn(&str) -> bool;
    let cases: [(&str, Refused); 6] = [
        (r#"{"vcpu_count":1,"mem_size_mib":64,"x":1}"#, |s| {
            serde_json::from_str::<MachineConfig>(s).is_err()
        }),
        (r#"{"kernel_image_path":"/k","x":1}"#, |s| {
            serde_json::from_str::<BootSource>(s).is_err()
        }),
        (r#"{"iface_id":"a","host_dev_name":"t","x":1}"#, |s| {
            serde_json::from_str::<NetworkInterface>(s).is_err()
        }),
        (r#"{"action_type":"InstanceStart","x":1}"#, |s| {
            serde_json::from_str::<InstanceActionInfo>(s).is_err()
        }),
        (r#"{"state":"Paused","x":1}"#, |s| {
            serde_json::from_str::<VmPatch>(s).is_err()
        }),
        (r#"{"metrics_path":"/m","x":1}"#, |s| {
            serde_json::from_str::<Metrics>(s).is_err()
        }),
    ];
    for (body, refused) in cases {
        assert!(refused(body), "{body}");
    }
    // Firecracker's defaults for the optional fields.
    let m: MachineConfig = serde_json::from_str(r#"{"vcpu_count":2,"mem_size_mib":64}"#).unwrap();
    assert!(!m.smt && !m.track_dirty_pages && m.huge_pages == HugePages::None);
    assert_eq!(MachineConfig::default().mem_size_mib, 128);
    let h: HugePages = serde_json::from_str(r#""2M""#).unwrap();
    assert_eq!(h, HugePages::Hugetlbfs2M);
}

#[test]
fn kernel_kinds_from_the_first_bytes() {
    assert_eq!(
        resources::kernel_kind(ppa_vmm::payload::tiny::TINY_GUEST),
        KernelKind::Tiny
    );
    let mut bz = vec![0u8; 0x400];
    bz[0x202..0x206].copy_from_slice(b"HdrS");
    assert_eq!(resources::kernel_kind(&bz), KernelKind::Linux);
    assert_eq!(resources::kernel_kind(b"text"), KernelKind::Linux);
    // An ELF whose one PT_LOAD is at the kernel's higher half: a vmlinux.
    let mut elf = vec![0u8; 0x100];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
    elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
    elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
    elf[0x40..0x44].copy_from_slice(&1u32.to_le_bytes());
    elf[0x50..0x58].copy_from_slice(&0xffff_ffff_8100_0000u64.to_le_bytes());
    assert_eq!(resources::kernel_kind(&elf), KernelKind::Linux);
    elf[0x50..0x58].copy_from_slice(&0x20_0000u64.to_le_bytes());
    assert_eq!(resources::kernel_kind(&elf), KernelKind::Tiny);
}

#[test]
fn tiny_workloads_come_from_boot_args() {
    let w =
        resources::tiny_workloads("console=ttyS0 ppa.workload=busy:ms=5 ppa.workload=1=idle:ms=9")
            .unwrap();
    assert_eq!(w, vec!["busy:ms=5", "1=idle:ms=9"]);
    assert!(resources::tiny_workloads("reboot=k panic=1")
        .unwrap()
        .is_empty());
    let e = resources::tiny_workloads("ppa.workload=spin")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`ppa.workload=spin` is not a tiny-guest workload"),
        "{e}"
    );
}

fn iface(id: &str, tap: &str) -> NetworkInterface {
    NetworkInterface {
        iface_id: id.into(),
        host_dev_name: tap.into(),
        guest_mac: None,
        mtu: None,
        rx_rate_limiter: None,
        tx_rate_limiter: None,
    }
}

#[test]
fn an_interface_becomes_a_net_value_and_its_limiters_become_rate_buckets() {
    let mut n = iface("eth0", "tap0");
    n.guest_mac = Some("02:00:00:00:00:01".into());
    n.mtu = Some(1400);
    assert_eq!(
        resources::net_spec(&n).unwrap(),
        "tap=tap0,id=eth0,mac=02:00:00:00:00:01,mtu=1400"
    );
    // A bucket of size 0 limits nothing (Firecracker's rule).
    let off = TokenBucket {
        size: 0,
        one_time_burst: None,
        refill_time: 100,
    };
    n.rx_rate_limiter = Some(RateLimiter {
        bandwidth: Some(off.clone()),
        ops: None,
    });
    assert_eq!(
        resources::net_spec(&n).unwrap(),
        "tap=tap0,id=eth0,mac=02:00:00:00:00:01,mtu=1400"
    );
    n.rx_rate_limiter = Some(RateLimiter {
        bandwidth: Some(TokenBucket {
            size: 125_000,
            one_time_burst: Some(1_000_000),
            refill_time: 10,
        }),
        ops: Some(off.clone()),
    });
    n.tx_rate_limiter = Some(RateLimiter {
        bandwidth: None,
        ops: Some(TokenBucket {
            size: 10,
            ..off.clone()
        }),
    });
    let spec = resources::net_spec(&n).unwrap();
    assert_eq!(
        spec,
        "tap=tap0,id=eth0,mac=02:00:00:00:00:01,mtu=1400,rate=rx-bytes:125000/10ms:burst=1000000+tx-packets:10/100ms"
    );
    let parsed = ppa_vmm::devices::net::spec::NetSpec::parse(&spec).unwrap();
    assert_eq!(parsed.rx_rate.bytes.unwrap().per_second(), 12_500_000);
    assert_eq!(parsed.tx_rate.ops.unwrap().per_second(), 100);
    // Firecracker takes refill times past an hour; we refuse them with the reason.
    n.tx_rate_limiter = Some(RateLimiter {
        bandwidth: None,
        ops: Some(TokenBucket {
            size: 10,
            one_time_burst: None,
            refill_time: 7_200_000,
        }),
    });
    let e = resources::net_spec(&n).unwrap_err().to_string();
    assert!(e.contains("is not a refill time from 1ms to 1h"), "{e}");
    let e = resources::net_spec(&iface("eth0", "a/b"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("Network interface error: `a/b` is not a usable interface name"),
        "{e}"
    );
}

fn drive(id: &str, path: &str, root: bool) -> Drive {
    serde_json::from_value(serde_json::json!({
        "drive_id": id, "path_on_host": path, "is_root_device": root, "is_read_only": false
    }))
    .unwrap()
}

#[test]
fn a_drive_becomes_a_disk_value_and_what_we_lack_is_refused() {
    let dir = TempDir::new().unwrap();
    let file = dir.as_path().join("rootfs.ext4");
    std::fs::write(&file, vec![0u8; 4096]).unwrap();
    let path = file.to_string_lossy().into_owned();
    let d = drive("rootfs", &path, true);
    assert_eq!(
        resources::disk_spec(&d).unwrap(),
        format!("path={path},id=rootfs")
    );
    let ro = Drive {
        is_read_only: Some(true),
        cache_type: Some("Writeback".into()),
        io_engine: Some("Async".into()),
        ..d.clone()
    };
    assert_eq!(
        resources::disk_spec(&ro).unwrap(),
        format!("path={path},id=rootfs,readonly=on")
    );
    // A limiter's bandwidth limits the requests' bytes, its ops the requests.
    let limited = Drive {
        rate_limiter: Some(RateLimiter {
            bandwidth: Some(TokenBucket {
                size: 10_000_000,
                one_time_burst: None,
                refill_time: 1000,
            }),
            ops: Some(TokenBucket {
                size: 100,
                one_time_burst: Some(50),
                refill_time: 100,
            }),
        }),
        ..d.clone()
    };
    assert_eq!(
        resources::disk_spec(&limited).unwrap(),
        format!("path={path},id=rootfs,rate=bytes:10000000/1000ms+ops:100/100ms:burst=50")
    );
    let refused = |d: Drive| resources::disk_spec(&d).unwrap_err().to_string();
    let e = refused(drive("rootfs", "/nonexistent/disk", true));
    assert!(
        e.starts_with("Drive config error: drive rootfs: cannot open /nonexistent/disk"),
        "{e}"
    );
    let e = refused(Drive {
        socket: Some("/run/vhost.sock".into()),
        ..d.clone()
    });
    assert!(e.contains("vhost-user block devices are not there"), "{e}");
    let e = refused(Drive {
        cache_type: Some("None".into()),
        ..d.clone()
    });
    assert!(e.contains("is not one of Unsafe and Writeback"), "{e}");
    let e = refused(Drive {
        partuuid: Some("1 init=/bin/sh".into()),
        ..d.clone()
    });
    assert!(e.contains("is not a partition UUID"), "{e}");
    let e = refused(Drive {
        path_on_host: Some(format!("{path},readonly=off")),
        ..d.clone()
    });
    assert!(e.contains("with a comma"), "{e}");
    let e = refused(drive("no/slash", &path, false));
    assert!(e.starts_with("Drive config error: drive no/slash: "), "{e}");
    // One root device; a refused drive leaves nothing behind.
    let mut r = Resources::default();
    r.put_drive(d.clone()).unwrap();
    let e = r
        .put_drive(drive("other", &path, true))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a root block device already exists (drive rootfs)"),
        "{e}"
    );
    assert!(r.put_drive(drive("bad", "/nonexistent/x", false)).is_err());
    assert_eq!(r.drives.len(), 1, "nothing kept of the refused ones");
    // Replacing the root drive by its id is not a second root.
    r.put_drive(d).unwrap();
    assert_eq!(r.drives.len(), 1);
}

#[test]
fn the_root_drive_is_the_first_disk_and_on_a_linux_command_line() {
    let dir = TempDir::new().unwrap();
    let file = |name: &str| {
        let p = dir.as_path().join(name);
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        p.to_string_lossy().into_owned()
    };
    let (data, root) = (file("data.img"), file("root.ext4"));
    let kernel = file("vmlinux");
    let mut r = Resources::default();
    r.put_drive(drive("data", &data, false)).unwrap();
    r.put_drive(drive("rootfs", &root, true)).unwrap();
    // A Linux kernel (what `put_boot` would find in a bzImage's header).
    r.boot = Some((
        BootSource {
            kernel_image_path: kernel.clone(),
            initrd_path: None,
            boot_args: Some("console=ttyS0".into()),
        },
        KernelKind::Linux,
    ));
    let o = r.to_run_options(RunOptions::default()).unwrap();
    assert_eq!(
        o.disk,
        vec![
            format!("path={root},id=rootfs"),
            format!("path={data},id=data")
        ]
    );
    assert_eq!(o.cmdline.as_deref(), Some("console=ttyS0 root=/dev/vda rw"));
    // A PARTUUID and read-only, as Firecracker writes them; boot args that name a root keep it.
    r.put_drive(Drive {
        partuuid: Some("0eaa91a0-01".into()),
        is_read_only: Some(true),
        ..drive("rootfs", &root, true)
    })
    .unwrap();
    let o = r.to_run_options(RunOptions::default()).unwrap();
    assert_eq!(
        o.cmdline.as_deref(),
        Some("console=ttyS0 root=PARTUUID=0eaa91a0-01 ro")
    );
    if let Some((b, _)) = &mut r.boot {
        b.boot_args = Some("root=/dev/vdb".into());
    }
    let o = r.to_run_options(RunOptions::default()).unwrap();
    assert_eq!(o.cmdline.as_deref(), Some("root=/dev/vdb"));
}

#[test]
fn machine_configs_are_checked_as_a_whole() {
    let mut r = Resources::default();
    let ok = MachineConfig {
        vcpu_count: 4,
        mem_size_mib: 64,
        ..Default::default()
    };
    r.put_machine(ok.clone()).unwrap();
    let bad: [(MachineConfig, &str); 7] = [
        (
            MachineConfig {
                vcpu_count: 0,
                ..ok.clone()
            },
            "between 1 and 256, not 0",
        ),
        (
            MachineConfig {
                mem_size_mib: 0,
                ..ok.clone()
            },
            "guest memory must be between",
        ),
        (
            MachineConfig {
                smt: true,
                ..ok.clone()
            },
            "smt cannot be enabled",
        ),
        (
            MachineConfig {
                track_dirty_pages: true,
                ..ok.clone()
            },
            "no dirty pages",
        ),
        (
            MachineConfig {
                huge_pages: HugePages::Transparent,
                ..ok.clone()
            },
            "huge_pages \"Transparent\" is not supported",
        ),
        (
            MachineConfig {
                huge_pages: HugePages::Hugetlbfs2M,
                mem_size_mib: 65,
                ..ok.clone()
            },
            "a multiple of 2, and it is 65",
        ),
        (
            MachineConfig {
                cpu_template: Some("T2".into()),
                ..ok.clone()
            },
            "\"T2\"",
        ),
    ];
    for (m, want) in bad {
        let e = r.put_machine(m).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
        assert_eq!(r.machine, ok, "a refused config changes nothing");
    }
    r.patch_machine(MachineConfigUpdate {
        mem_size_mib: Some(96),
        ..Default::default()
    })
    .unwrap();
    assert_eq!((r.machine.vcpu_count, r.machine.mem_size_mib), (4, 96));
}

#[test]
fn resources_translate_into_run_options() {
    let dir = TempDir::new().unwrap();
    let tiny = tiny_file(&dir);
    let mut r = Resources::default();
    assert!(matches!(
        r.to_run_options(RunOptions::default()),
        Err(ResourceError::NoKernel)
    ));
    r.put_machine(MachineConfig {
        vcpu_count: 2,
        mem_size_mib: 64,
        ..Default::default()
    })
    .unwrap();
    r.put_boot(BootSource {
        kernel_image_path: tiny.clone(),
        initrd_path: None,
        boot_args: Some("ppa.workload=busy:ms=5".into()),
    })
    .unwrap();
    r.put_net(iface("eth0", "tap0")).unwrap();
    let base = RunOptions {
        cpu_limit: Some("50%".into()),
        ..Default::default()
    };
    let o = r.to_run_options(base).unwrap();
    assert_eq!((o.vcpus, o.memory_mib), (Some(2), Some(64)));
    assert_eq!(o.tiny_image.as_deref(), Some(std::path::Path::new(&tiny)));
    assert_eq!(o.workload, vec!["busy:ms=5"]);
    assert_eq!(o.net, vec!["tap=tap0,id=eth0"]);
    assert_eq!(
        o.cpu_limit.as_deref(),
        Some("50%"),
        "--ppa-config's options stay"
    );
    assert_eq!(o.memory_backing, None, "huge_pages None: 4 KiB pages");
    // huge_pages "2M" is our hugepage backing with 2 MiB pages (the pool is read at the start).
    r.patch_machine(MachineConfigUpdate {
        huge_pages: Some(HugePages::Hugetlbfs2M),
        ..Default::default()
    })
    .unwrap();
    let o = r.to_run_options(RunOptions::default()).unwrap();
    assert_eq!(o.memory_backing.as_deref(), Some("hugepages=2M"));
    let (config, _) = o.into_config().expect("a config our run path takes");
    assert_eq!(format!("{:?}", config.memory_backing.page), "Huge2M");
    // An initrd goes with a Linux kernel only; a kernel that is not there is refused at PUT.
    let e = r
        .put_boot(BootSource {
            kernel_image_path: tiny.clone(),
            initrd_path: Some(tiny.clone()),
            boot_args: None,
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("takes no initrd"), "{e}");
    let e = r
        .put_boot(BootSource {
            kernel_image_path: "/nonexistent/vmlinux".into(),
            initrd_path: None,
            boot_args: None,
        })
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("Boot source error: the kernel file /nonexistent/vmlinux cannot be opened"),
        "{e}"
    );
}

#[test]
fn interfaces_replace_by_id_and_macs_stay_unique() {
    let mut r = Resources::default();
    let mut a = iface("eth0", "tap0");
    a.guest_mac = Some("02:00:00:00:00:01".into());
    r.put_net(a.clone()).unwrap();
    let mut b = iface("eth1", "tap1");
    b.guest_mac = Some("02:00:00:00:00:01".into());
    let e = r.put_net(b).unwrap_err().to_string();
    assert!(e.contains("02:00:00:00:00:01 is already in use"), "{e}");
    r.put_net(iface("eth0", "tap9")).unwrap();
    assert_eq!(r.nets.len(), 1);
    assert_eq!(r.nets[0].host_dev_name, "tap9");
}

#[test]
fn config_files_refuse_what_is_not_there() {
    let dir = TempDir::new().unwrap();
    let tiny = tiny_file(&dir);
    let write = |name: &str, text: String| {
        let p = dir.as_path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let ok = write(
        "ok.json",
        format!(
            r#"{{"boot-source":{{"kernel_image_path":"{tiny}"}},
                "machine-config":{{"vcpu_count":1,"mem_size_mib":64}},
                "network-interfaces":[],"drives":[]}}"#
        ),
    );
    let (r, _) = Resources::from_config_file(&ok).unwrap();
    assert_eq!(r.machine.mem_size_mib, 64);
    let vsock = write(
        "vsock.json",
        format!(
            r#"{{"boot-source":{{"kernel_image_path":"{tiny}"}},
                "vsock":{{"guest_cid":3,"uds_path":"/v.sock"}}}}"#
        ),
    );
    let e = Resources::from_config_file(&vsock).unwrap_err().to_string();
    assert!(
        e.contains("`vsock` section is not supported: vsock is not there yet"),
        "{e}"
    );
    let unknown = write("unknown.json", r#"{"boot_source":{}}"#.into());
    let e = Resources::from_config_file(&unknown)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `boot_source`"), "{e}");
    let no_kernel = write("nok.json", "{}".into());
    let e = Resources::from_config_file(&no_kernel)
        .unwrap_err()
        .to_string();
    assert!(e.contains("without kernel configuration"), "{e}");
}

#[test]
fn requests_are_read_whole_and_bounded() {
    let full = b"PUT /actions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabcd";
    assert_eq!(
        http::parse(&full[..full.len() - 1], 100),
        Ok(Parsed::Incomplete)
    );
    let Ok(Parsed::Done(r)) = http::parse(full, 100) else {
        panic!("a whole request")
    };
    assert_eq!(
        (r.method, r.path.as_str(), &r.body[..]),
        (Method::Put, "/actions", &b"abcd"[..])
    );
    let e = http::parse(full, 3).unwrap_err().to_string();
    assert!(e.contains("size 4 is larger than the limit of 3"), "{e}");
    let chunked = b"PUT /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_eq!(http::parse(chunked, 100), Err(http::HttpError::Chunked));
    assert_eq!(
        http::parse(b"GET / HTTP/2\r\n\r\n", 100),
        Err(http::HttpError::RequestLine)
    );
    assert!(matches!(
        http::parse(b"DELETE /drives/x HTTP/1.1\r\n\r\n", 100),
        Err(http::HttpError::Method(_))
    ));
    let long = vec![b'a'; http::MAX_HEAD + 1];
    assert_eq!(http::parse(&long, 100), Err(http::HttpError::HeadTooLong));
    let get = http::Response::no_content().to_bytes();
    assert!(String::from_utf8(get)
        .unwrap()
        .starts_with("HTTP/1.1 204 No Content\r\n"));
}

#[test]
fn routes_answer_as_firecracker_does_before_the_start() {
    let (mut a, starts) = api();
    let (s, body) = call(&mut a, Method::Get, "/", "");
    assert_eq!(s, 200);
    let info: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(info["state"], "Not started");
    assert_eq!(info["id"], "vm_1");
    let cases: [(Method, &str, &str, &str); 12] = [
        (
            Method::Put,
            "/machine-config",
            r#"{"vcpu_count":1}"#,
            "missing field `mem_size_mib`",
        ),
        (Method::Put, "/machine-config", "", "Empty PUT request."),
        (
            Method::Patch,
            "/machine-config",
            "{}",
            "Empty PATCH request.",
        ),
        (
            Method::Get,
            "/machine-config",
            "{}",
            "GET request cannot have a body.",
        ),
        (
            Method::Put,
            "/network-interfaces/eth0",
            r#"{"iface_id":"eth1","host_dev_name":"t"}"#,
            "The id from the path [eth0] does not match the id from the body [eth1]!",
        ),
        (
            Method::Put,
            "/network-interfaces/e-0",
            r#"{"iface_id":"e-0","host_dev_name":"t"}"#,
            "only contain alphanumeric characters and underscores",
        ),
        (Method::Put, "/drives/", "{}", "The ID cannot be empty."),
        (
            Method::Patch,
            "/vm",
            r#"{"state":"Paused"}"#,
            "not supported before starting the microVM",
        ),
        (
            Method::Put,
            "/actions",
            r#"{"action_type":"SendCtrlAltDel"}"#,
            "before starting",
        ),
        (
            Method::Put,
            "/actions",
            r#"{"action_type":"InstanceStart"}"#,
            "Cannot start microvm without kernel configuration.",
        ),
        (
            Method::Put,
            "/snapshot/create",
            "{}",
            "PUT /snapshot is not supported: PPA-VMM takes no snapshots.",
        ),
        (
            Method::Get,
            "/nothing",
            "",
            "Invalid request method and/or path: GET /nothing.",
        ),
    ];
    for (m, path, body, want) in cases {
        let (s, text) = call(&mut a, m, path, body);
        assert_eq!(s, 400, "{path} {body}: {text}");
        assert!(text.contains(want), "{path} {body}: {text}");
    }
    assert!(starts.0.lock().unwrap().is_empty(), "no start was asked");
}

#[test]
fn a_failed_start_says_why_and_leaves_the_instance_not_started() {
    let dir = TempDir::new().unwrap();
    let tiny = tiny_file(&dir);
    let (mut a, starts) = api();
    let boot = format!(r#"{{"kernel_image_path":"{tiny}","boot_args":"ppa.workload=idle:ms=5"}}"#);
    assert_eq!(call(&mut a, Method::Put, "/boot-source", &boot).0, 204);
    let mc = r#"{"vcpu_count":2,"mem_size_mib":64}"#;
    assert_eq!(call(&mut a, Method::Put, "/machine-config", mc).0, 204);
    let (s, text) = call(
        &mut a,
        Method::Put,
        "/actions",
        r#"{"action_type":"InstanceStart"}"#,
    );
    assert_eq!(
        (s, text.as_str()),
        (
            400,
            "Start microvm error: the VM could not be built: no KVM here"
        )
    );
    let asked = starts.0.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(
        (asked[0].vcpus, asked[0].workload.clone()),
        (Some(2), vec!["idle:ms=5".to_string()])
    );
    // Still configurable: nothing started.
    assert_eq!(call(&mut a, Method::Put, "/machine-config", mc).0, 204);
    let (_, body) = call(&mut a, Method::Get, "/vm/config", "");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["machine-config"]["vcpu_count"], 2);
    assert_eq!(v["boot-source"]["kernel_image_path"], tiny.as_str());
    assert_eq!(v["vsock"], serde_json::Value::Null);
}

#[test]
fn metrics_lines_count_requests_since_the_previous_line() {
    let mut counts = BTreeMap::new();
    counts.insert(("put_api_requests", "machine_cfg_count".to_string()), 3);
    counts.insert(("put_api_requests", "machine_cfg_fails".to_string()), 1);
    let mut prev = BTreeMap::new();
    let first = metrics::line(1000, None, &counts, &mut prev);
    assert_eq!(first["utc_timestamp_ms"], 1000);
    assert_eq!(first["put_api_requests"]["machine_cfg_count"], 3);
    assert_eq!(first["put_api_requests"]["machine_cfg_fails"], 1);
    counts.insert(("put_api_requests", "machine_cfg_count".to_string()), 5);
    let second = metrics::line(2000, None, &counts, &mut prev);
    assert_eq!(second["put_api_requests"]["machine_cfg_count"], 2);
    assert_eq!(second["put_api_requests"]["machine_cfg_fails"], 0);
    assert!(second.get("vcpu").is_none(), "no VM, no VM figures");
}

#[test]
fn the_metrics_file_is_set_once_and_written_in_lines() {
    let dir = TempDir::new().unwrap();
    let path = dir.as_path().join("m.fifo-or-file");
    let m = Metrics {
        metrics_path: path.to_string_lossy().into_owned(),
        emit_id: true,
        properties: Some([("k".to_string(), "v".to_string())].into()),
    };
    let mut s = MetricsState::default();
    assert!(!s.due(std::time::Instant::now()));
    s.configure(&m, "vm_1").unwrap();
    let e = s.configure(&m, "vm_1").unwrap_err().to_string();
    assert!(e.contains("Reinitialization of metrics not allowed"), "{e}");
    s.count("get_api_requests", "instance_info", false);
    s.flush(None).unwrap();
    s.flush(None).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["id"], "vm_1");
    assert_eq!(lines[0]["properties"]["k"], "v");
    assert_eq!(lines[0]["get_api_requests"]["instance_info_count"], 1);
    assert_eq!(lines[1]["get_api_requests"]["instance_info_count"], 0);
    assert!(!s.due(std::time::Instant::now() + metrics::FLUSH_INTERVAL / 2));
    assert!(s.due(std::time::Instant::now() + metrics::FLUSH_INTERVAL));
}

/// The `fc_api` thread over a real Unix socket: a whole exchange, a request cut in two
/// writes, and a malformed one.
#[test]
fn the_api_thread_answers_over_its_socket() {
    let dir = TempDir::new().unwrap();
    let sock = dir.as_path().join("api.sock");
    let listener = ppa_vmm::unix_socket::bind_unix(&sock).unwrap();
    let (a, _) = api();
    let m = Arc::new(Mutex::new(MetricsState::default()));
    let server = super::server::Server::new(a, Some(listener), m);
    std::thread::spawn(move || server.run());
    let exchange = |parts: &[&[u8]]| {
        let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        for p in parts {
            c.write_all(p).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    };
    let out = exchange(&[b"GET /version HTTP/1.1\r\nHost: localhost\r\n\r\n"]);
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    assert!(
        out.ends_with(&format!(
            r#"{{"firecracker_version":"{}"}}"#,
            super::api::VERSION
        )),
        "{out}"
    );
    let body = r#"{"vcpu_count":2,"mem_size_mib":64}"#;
    let head = format!(
        "PUT /machine-config HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let out = exchange(&[head.as_bytes(), body.as_bytes()]);
    assert!(out.starts_with("HTTP/1.1 204 No Content\r\n"), "{out}");
    let out = exchange(&[b"GET /machine-config HTTP/1.1\r\n\r\n"]);
    assert!(out.contains(r#""vcpu_count":2"#), "{out}");
    let out = exchange(&[b"NONSENSE\r\n\r\n"]);
    assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    assert!(out.contains("fault_message"), "{out}");
}
