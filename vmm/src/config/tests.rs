//! Tests of the run options: files, command lines and their merge.

use super::*;

fn opts(json: &str) -> Result<RunOptions, serde_json::Error> {
    serde_json::from_str(json)
}

#[test]
fn file_and_command_line_merge() {
    let file =
        opts(r#"{"vcpus": 4, "memory_mib": 64, "workload": ["busy:ms=5"], "report": "json"}"#)
            .unwrap();
    let cli = RunOptions {
        vcpus: Some(2),
        workload: vec!["1=idle:ms=1".into()],
        ..Default::default()
    };
    let (vm, report) = file.merge(cli).into_config().unwrap();
    assert_eq!(vm.vcpus, 2);
    assert_eq!(vm.memory_mib, 64);
    let Payload::Tiny {
        image, workloads, ..
    } = &vm.payload
    else {
        panic!("a tiny guest by default");
    };
    assert_eq!(workloads.len(), 2);
    assert_eq!(workloads[1].target, Some(1));
    assert_eq!(report.format, ReportFormat::Json);
    assert_eq!(*image, TinyImage::Embedded);
    assert!(vm.prefault, "prefault is on by default");
}

#[test]
fn rejects_unknown_keys_and_bad_values() {
    assert!(opts(r#"{"cpus": 4}"#)
        .unwrap_err()
        .to_string()
        .contains("unknown field"));
    assert!(opts(r#"{"vcpus": -1}"#).is_err());
    // Found by the config fuzzer in CI: a count this large sized the group check's table
    // (an allocation of 150 TB) before the count's range was checked.
    let huge = opts(r#"{"vcpus": 9999999999999}"#).unwrap().into_config();
    assert!(
        matches!(huge, Err(ConfigError::Vcpus(9_999_999_999_999))),
        "{huge:?}"
    );
    assert!(opts(r#"{"report": "xml"}"#).is_err());
    let bad = |o: RunOptions| o.into_config().unwrap_err();
    assert!(matches!(
        bad(RunOptions {
            vcpus: Some(0),
            ..Default::default()
        }),
        ConfigError::Vcpus(0)
    ));
    assert!(matches!(
        bad(RunOptions {
            vcpus: Some(257),
            ..Default::default()
        }),
        ConfigError::Vcpus(257)
    ));
    assert!(matches!(
        bad(RunOptions {
            memory_mib: Some(1),
            ..Default::default()
        }),
        ConfigError::Memory(1)
    ));
    assert!(matches!(
        bad(RunOptions {
            memory_mib: Some(1 << 40),
            ..Default::default()
        }),
        ConfigError::Memory(_)
    ));
    assert!(matches!(
        bad(RunOptions {
            guest: Some("linux".into()),
            ..Default::default()
        }),
        ConfigError::UnknownGuest(_)
    ));
    assert!(matches!(
        bad(RunOptions {
            guest: Some("tiny".into()),
            tiny_image: Some("x".into()),
            ..Default::default()
        }),
        ConfigError::GuestAndKernel
    ));
    assert!(matches!(
        bad(RunOptions {
            kernel: Some("bzImage".into()),
            workload: vec!["busy".into()],
            ..Default::default()
        }),
        ConfigError::WorkloadForLinux
    ));
    assert!(matches!(
        bad(RunOptions {
            initrd: Some("initrd.img".into()),
            ..Default::default()
        }),
        ConfigError::LinuxOptionWithoutKernel
    ));
    let (vm, _) = RunOptions {
        kernel: Some("/boot/vmlinuz".into()),
        initrd: Some("/boot/initrd.img".into()),
        cmdline: Some("quiet".into()),
        ..Default::default()
    }
    .into_config()
    .unwrap();
    assert_eq!(
        vm.payload,
        Payload::Linux {
            kernel: "/boot/vmlinuz".into(),
            initrd: Some("/boot/initrd.img".into()),
            cmdline: "quiet".into()
        }
    );
    assert!(
        opts(r#"{"config": "other.json"}"#).is_err(),
        "no nested config files"
    );
    let (vm, _) = opts(r#"{"tiny_image": "/x.elf", "prefault": false, "limit_backend": "cgroup"}"#)
        .unwrap()
        .into_config()
        .unwrap();
    assert!(!vm.prefault);
    assert_eq!(vm.limits.backend, Backend::Cgroup);
    assert!(matches!(
        vm.payload,
        Payload::Tiny {
            image: TinyImage::File(_),
            ..
        }
    ));
    assert!(opts(r#"{"limit_backend": "kernel"}"#).is_err());
    let (vm, _) = opts(r#"{"tiny_image": "/x.elf", "limit_kick": "limiter"}"#)
        .unwrap()
        .into_config()
        .unwrap();
    assert_eq!(vm.limits.kick, KickMode::Limiter);
    assert!(opts(r#"{"limit_kick": "signal"}"#).is_err());
    assert!(matches!(
        bad(RunOptions {
            max_runtime: Some(-1.0),
            ..Default::default()
        }),
        ConfigError::MaxRuntime(_)
    ));
    let e = bad(RunOptions {
        workload: vec!["nap:ms=1".into()],
        ..Default::default()
    });
    assert!(matches!(e, ConfigError::Workload { .. }));
}

#[test]
fn accounting_options() {
    let o =
        opts(r#"{"accounting": "full", "histogram_bits": 5, "threshold": ["guest_run_ns=1000"]}"#)
            .unwrap();
    let (vm, _) = o.into_config().unwrap();
    assert_eq!(vm.accounting, Level::Full);
    assert_eq!(vm.histogram_bits, 5);
    assert_eq!(vm.thresholds.guest_run_ns, 1000);
    assert!(opts(r#"{"accounting": "max"}"#).is_err());
    let bad = |o: RunOptions| o.into_config().unwrap_err();
    assert!(matches!(
        bad(RunOptions {
            histogram_bits: Some(6),
            ..Default::default()
        }),
        ConfigError::HistogramBits(6)
    ));
    for t in ["guest_run=5", "guest_run_ns", "guest_run_ns=x"] {
        assert!(matches!(
            bad(RunOptions {
                threshold: vec![t.into()],
                ..Default::default()
            }),
            ConfigError::Threshold(_)
        ));
    }
}

#[test]
fn control_options() {
    let o =
        opts(r#"{"name": "nf-1", "api_sock": "/run/ppa.sock", "metrics_addr": "127.0.0.1:9464"}"#)
            .unwrap();
    let (vm, _) = o.into_config().unwrap();
    assert_eq!(vm.name.as_deref(), Some("nf-1"));
    assert_eq!(vm.metrics_addr.unwrap().port(), 9464);
    let bad = |o: RunOptions| o.into_config().unwrap_err();
    for a in ["localhost", "127.0.0.1", "1.2.3.4:99999", ""] {
        let e = bad(RunOptions {
            metrics_addr: Some(a.into()),
            ..Default::default()
        });
        assert!(matches!(e, ConfigError::MetricsAddr(_)), "{a}");
    }
    for n in ["", "a\nb", &"x".repeat(129)] {
        let e = bad(RunOptions {
            name: Some(n.into()),
            ..Default::default()
        });
        assert!(matches!(e, ConfigError::Name(_)), "{n:?}");
    }
    let e = bad(RunOptions {
        api_sock: Some(PathBuf::new()),
        ..Default::default()
    });
    assert!(matches!(e, ConfigError::ApiSock));
}

#[test]
fn client_time_limits() {
    let (vm, _) = RunOptions::default().into_config().unwrap();
    assert_eq!(vm.client_limits, crate::api::ClientLimits::default());
    let o = opts(r#"{"client_timeout": 2.5, "idle_timeout": 0}"#).unwrap();
    let (vm, _) = o.into_config().unwrap();
    assert_eq!(vm.client_limits.client_timeout, Duration::from_millis(2500));
    assert_eq!(vm.client_limits.idle_timeout, None, "0: never idle");
    let o = opts(r#"{"idle_timeout": 60}"#).unwrap();
    let (vm, _) = o.into_config().unwrap();
    assert_eq!(vm.client_limits.idle_timeout, Some(Duration::from_secs(60)));
    for (client, idle) in [
        (Some(0.0), None),
        (Some(-1.0), None),
        (Some(f64::NAN), None),
        (Some(f64::INFINITY), None),
        (Some(1e10), None),
        (None, Some(-0.5)),
        (None, Some(f64::NAN)),
    ] {
        let e = RunOptions {
            client_timeout: client,
            idle_timeout: idle,
            ..Default::default()
        }
        .into_config()
        .unwrap_err();
        assert!(
            matches!(e, ConfigError::ClientTimeout(..)),
            "{client:?} {idle:?}: {e}"
        );
    }
}

#[test]
fn missing_config_file_is_named() {
    let e = RunOptions::from_file(Path::new("/nonexistent/ppa.json")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/ppa.json"));
}

/// Both naming schemes fit a thread name (15 bytes) for every vCPU a VM may have, and
/// Firecracker's is the one Kata Containers parses (`fc_vcpu` then the index).
#[test]
fn vcpu_thread_names_fit_and_match_firecracker() {
    use super::VcpuNames;
    assert_eq!(VcpuNames::Ppa.name(3), "vcpu3");
    assert_eq!(VcpuNames::Firecracker.name(3), "fc_vcpu 3");
    for names in [VcpuNames::Ppa, VcpuNames::Firecracker] {
        assert!(names.name(super::MAX_VCPUS - 1).len() <= 15);
    }
    assert_eq!(VcpuNames::default(), VcpuNames::Ppa);
}
