//! Tests of KVM's binary statistics: the descriptor parser and reading values.

use super::*;

const NAME_SIZE: usize = 48;

/// Builds a stats file: header, id, descriptors, data (values `base + k`).
/// Each entry is (flags, exponent, size, name); offsets are packed in order.
fn build(id: &str, descs: &[(u32, i16, u16, &str)], base: u64) -> Vec<u8> {
    let id_offset = HEADER_SIZE;
    let desc_offset = id_offset + NAME_SIZE;
    let desc_size = DESC_FIXED_SIZE + NAME_SIZE;
    let data_offset = desc_offset + descs.len() * desc_size;
    let mut f = Vec::new();
    for v in [
        0u32,
        NAME_SIZE as u32,
        descs.len() as u32,
        id_offset as u32,
        desc_offset as u32,
        data_offset as u32,
    ] {
        f.extend_from_slice(&v.to_ne_bytes());
    }
    let name = |s: &str, f: &mut Vec<u8>| {
        let mut raw = [0u8; NAME_SIZE];
        raw[..s.len()].copy_from_slice(s.as_bytes());
        f.extend_from_slice(&raw);
    };
    name(id, &mut f);
    let mut offset = 0u32;
    for &(flags, exponent, size, n) in descs {
        f.extend_from_slice(&flags.to_ne_bytes());
        f.extend_from_slice(&exponent.to_ne_bytes());
        f.extend_from_slice(&size.to_ne_bytes());
        f.extend_from_slice(&offset.to_ne_bytes());
        f.extend_from_slice(&0u32.to_ne_bytes());
        name(n, &mut f);
        offset += u32::from(size) * 8;
    }
    assert_eq!(f.len(), data_offset);
    for k in 0..u64::from(offset / 8) {
        f.extend_from_slice(&(base + k).to_ne_bytes());
    }
    f
}

fn sample_descs() -> Vec<(u32, i16, u16, &'static str)> {
    vec![
        (
            KVM_STATS_TYPE_CUMULATIVE | KVM_STATS_UNIT_NONE,
            0,
            1,
            "exits",
        ),
        (
            KVM_STATS_TYPE_LOG_HIST | KVM_STATS_UNIT_SECONDS,
            -9,
            32,
            "halt_poll_success_hist",
        ),
        (
            KVM_STATS_TYPE_CUMULATIVE | KVM_STATS_UNIT_SECONDS,
            -9,
            1,
            "halt_wait_ns",
        ),
    ]
}

fn sample() -> Vec<u8> {
    build("kvm-1/vcpu-0", &sample_descs(), 100)
}

#[test]
fn parse_synthetic_file() {
    let f = sample();
    let l = StatsLayout::parse(&f).unwrap();
    assert_eq!(l.id, "kvm-1/vcpu-0");
    assert_eq!(l.data_offset, (HEADER_SIZE + NAME_SIZE + 3 * 64) as u64);
    assert_eq!(l.data_len, 34 * 8);
    assert_eq!(
        l.descs[0],
        StatDesc {
            name: "exits".into(),
            kind: KvmStatType::Cumulative,
            unit: StatUnit::None,
            exponent: 0,
            size: 1,
            offset: 0,
            bucket_size: 0,
        }
    );
    assert_eq!(l.descs[1].name, "halt_poll_success_hist");
    assert_eq!(l.descs[1].kind, KvmStatType::LogHist);
    assert_eq!(l.descs[1].unit, StatUnit::Seconds);
    assert_eq!(l.descs[1].exponent, -9);
    assert_eq!(l.descs[1].size, 32);
    assert_eq!(l.descs[1].offset, 8);
    assert_eq!(l.descs[2].name, "halt_wait_ns");
    assert_eq!(l.descs[2].offset, 33 * 8);
    assert_eq!(l.scalar_indices(), vec![0, 2]);
    // Only the prefix is needed.
    assert_eq!(StatsLayout::parse(&f[..l.data_offset as usize]).unwrap(), l);
}

#[test]
fn flags_decode() {
    assert_eq!(
        KvmStatType::from_flags(KVM_STATS_TYPE_INSTANT),
        KvmStatType::Instant
    );
    assert_eq!(
        KvmStatType::from_flags(KVM_STATS_TYPE_PEAK),
        KvmStatType::Peak
    );
    assert_eq!(
        KvmStatType::from_flags(KVM_STATS_TYPE_LINEAR_HIST),
        KvmStatType::LinearHist
    );
    assert_eq!(KvmStatType::from_flags(9), KvmStatType::Unknown(9));
    assert_eq!(StatUnit::from_flags(KVM_STATS_UNIT_BYTES), StatUnit::Bytes);
    assert_eq!(
        StatUnit::from_flags(KVM_STATS_UNIT_CYCLES),
        StatUnit::Cycles
    );
    assert_eq!(
        StatUnit::from_flags(KVM_STATS_UNIT_BOOLEAN),
        StatUnit::Boolean
    );
    assert_eq!(StatUnit::from_flags(0x70), StatUnit::Unknown(7));
    // Base bits are ignored by kind and unit.
    assert_eq!(
        StatUnit::from_flags(kvm_bindings::KVM_STATS_BASE_POW2 | KVM_STATS_UNIT_BYTES),
        StatUnit::Bytes
    );
}

/// Reads a synthetic file through the same pread path as a real stats fd.
#[test]
fn read_scalars_from_file() {
    let path = std::env::temp_dir().join(format!("ppa-kvm-stats-{}", std::process::id()));
    std::fs::write(&path, sample()).unwrap();
    let file = File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let s = KvmStats::from_stats_file(file).unwrap();
    assert_eq!(
        s.scalar_names().collect::<Vec<_>>(),
        ["exits", "halt_wait_ns"]
    );
    assert_eq!(s.scalar_count(), 2);
    assert_eq!(s.scalar_index("halt_wait_ns"), Some(1));
    assert_eq!(s.known_index(KnownStat::HaltWaitNs), Some(1));
    assert_eq!(s.known_index(KnownStat::Exits), Some(0));
    assert_eq!(s.known_index(KnownStat::HaltExits), None);
    assert_eq!(s.scalar_kind(1), Some(s.layout().descs[s.scalars[1]].kind));
    assert_eq!(s.scalar_kind(2), None);
    assert_eq!(s.scalar_index("halt_poll_success_hist"), None);
    let mut scratch = Vec::new();
    let mut out = [0u64; 3];
    s.read_scalars(&mut scratch, &mut out).unwrap();
    assert_eq!(out, [100, 133, 0]);
    let cap = scratch.capacity();
    s.read_scalars(&mut scratch, &mut out).unwrap();
    assert_eq!(scratch.capacity(), cap);
    assert!(matches!(
        s.read_scalars(&mut scratch, &mut out[..1]),
        Err(KvmStatsError::OutputTooShort { needed: 2, got: 1 })
    ));
    assert_eq!(
        s.read_map().unwrap(),
        vec![
            ("exits".to_string(), 100),
            ("halt_wait_ns".to_string(), 133)
        ]
    );
}

#[test]
fn truncated_file_is_an_error() {
    let f = sample();
    let prefix = f.len() - 34 * 8;
    for len in 0..prefix {
        assert!(
            matches!(
                StatsLayout::parse(&f[..len]),
                Err(KvmStatsError::Malformed(_))
            ),
            "len {len}"
        );
    }
    for len in prefix..=f.len() {
        StatsLayout::parse(&f[..len]).unwrap();
    }
}

/// Overwrites the header field at byte `at` with `v`.
fn patched(f: &[u8], at: usize, v: u32) -> Vec<u8> {
    let mut f = f.to_vec();
    f[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    f
}

#[test]
fn bad_header_fields_are_errors() {
    // Only the header, id and descriptors, so that a descriptor past them is truncated.
    let mut f = sample();
    f.truncate(f.len() - 34 * 8);
    let cases = [
        (4, 0),                 // name_size 0
        (4, MAX_NAME_SIZE + 1), // name_size huge
        (4, u32::MAX),          // name_size max
        (4, 47),                // name_size off by one: names shift, NUL lost or truncated
        (8, MAX_NUM_DESC + 1),  // num_desc huge
        (8, u32::MAX),          // num_desc max
        (8, 4),                 // one descriptor past the end
        (12, f.len() as u32),   // id past the end
        (12, u32::MAX),         // id offset max
        (16, f.len() as u32),   // descriptors past the end
        (16, u32::MAX - 10),    // descriptor offset max
    ];
    for (at, v) in cases {
        let r = StatsLayout::parse(&patched(&f, at, v));
        assert!(
            matches!(r, Err(KvmStatsError::Malformed(_))),
            "{at} {v}: {r:?}"
        );
    }
    // A name without NUL.
    let mut g = f.clone();
    let name = HEADER_SIZE + NAME_SIZE + DESC_FIXED_SIZE;
    g[name..name + NAME_SIZE].fill(b'a');
    assert!(StatsLayout::parse(&g).is_err());
    // Invalid UTF-8 is replaced, not rejected.
    let mut g = f.clone();
    g[name] = 0xff;
    assert_eq!(
        StatsLayout::parse(&g).unwrap().descs[0].name,
        "\u{fffd}xits"
    );
    // A descriptor whose values end beyond MAX_BLOCK_LEN.
    let offset = HEADER_SIZE + NAME_SIZE + 8;
    let r = StatsLayout::parse(&patched(&f, offset, u32::MAX));
    assert!(matches!(r, Err(KvmStatsError::Malformed(_))), "{r:?}");
    // data_offset is not checked against the prefix (the data block need not be present),
    // but a huge one still parses to an in-range layout.
    let l = StatsLayout::parse(&patched(&f, 20, u32::MAX)).unwrap();
    assert_eq!(l.data_offset, u64::from(u32::MAX));
}

/// A small xorshift generator: deterministic garbage without a dependency.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn random_bytes_never_panic() {
    let mut st = 0x9e37_79b9_7f4a_7c15u64;
    let f = sample();
    for round in 0..20_000 {
        let bytes: Vec<u8> = if round % 2 == 0 {
            // Pure garbage, with small plausible header values half the time.
            let len = (xorshift(&mut st) % 600) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| xorshift(&mut st) as u8).collect();
            if round % 4 == 0 && b.len() >= HEADER_SIZE {
                for at in (4..HEADER_SIZE).step_by(4) {
                    let v = (xorshift(&mut st) % 300) as u32;
                    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
                }
            }
            b
        } else {
            // A valid file with a few bytes flipped and maybe cut.
            let mut b = f.clone();
            for _ in 0..1 + xorshift(&mut st) % 4 {
                let at = (xorshift(&mut st) as usize) % b.len();
                b[at] = xorshift(&mut st) as u8;
            }
            let len = (xorshift(&mut st) as usize) % (b.len() + 1);
            b.truncate(len.max(b.len() / 2));
            b
        };
        if let Ok(l) = StatsLayout::parse(&bytes) {
            for d in &l.descs {
                assert!(d.offset as usize + d.size as usize * 8 <= l.data_len);
            }
            assert!(l.data_len as u64 <= MAX_BLOCK_LEN);
        }
    }
}

#[test]
fn kvm_stats_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<KvmStats>();
}

/// The neutral view the accounting reads: the same names, kinds, known indices and values.
#[test]
fn vcpu_stats_over_a_kvm_stats_file() {
    let path = std::env::temp_dir().join(format!("ppa-vcpu-stats-{}", std::process::id()));
    std::fs::write(&path, sample()).unwrap();
    let file = File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let kvm = KvmStats::from_stats_file(file).unwrap();
    let want_kinds: Vec<Option<KvmStatType>> = (0..3).map(|i| kvm.scalar_kind(i)).collect();
    let s = crate::hypervisor::stats::VcpuStats::new(Box::new(kvm));
    assert_eq!(
        s.scalar_names().collect::<Vec<_>>(),
        ["exits", "halt_wait_ns"]
    );
    assert_eq!(s.scalar_count(), 2);
    for (i, want) in want_kinds.into_iter().enumerate() {
        let neutral = want.map(|k| match k {
            KvmStatType::Cumulative => StatKind::Cumulative,
            _ => StatKind::Current,
        });
        assert_eq!(s.scalar_kind(i), neutral);
    }
    assert_eq!(s.known_index(KnownStat::HaltWaitNs), Some(1));
    assert_eq!(s.known_index(KnownStat::Blocking), None);
    let mut out = [0u64; 2];
    s.read_scalars(&mut Vec::new(), &mut out).unwrap();
    assert_eq!(out, [100, 133]);
    assert!(s.read_scalars(&mut Vec::new(), &mut out[..1]).is_err());
}

#[test]
fn vcpu_stats_from_kvm() {
    use kvm_ioctls::Kvm;

    let kvm = Kvm::new().unwrap_or_else(|e| panic!("this test needs /dev/kvm: {e}"));
    let vm = kvm.create_vm().expect("KVM_CREATE_VM");
    let vcpu = vm.create_vcpu(0).expect("KVM_CREATE_VCPU");
    let stats = KvmStats::from_fd(&vcpu).expect("vCPU stats");
    let names: Vec<&str> = stats.scalar_names().collect();
    println!("id: {}", stats.layout().id);
    println!("scalars ({}): {names:?}", names.len());
    for d in &stats.layout().descs {
        println!(
            "  {:<32} {:?} {:?} exp={} size={} offset={} bucket={}",
            d.name, d.kind, d.unit, d.exponent, d.size, d.offset, d.bucket_size
        );
    }
    assert!(names.contains(&"exits"), "no `exits` in {names:?}");
    assert!(
        names.contains(&"halt_wait_ns"),
        "no `halt_wait_ns` in {names:?}"
    );
    let hw = &stats.layout().descs[stats.scalars[stats.scalar_index("halt_wait_ns").unwrap()]];
    assert_eq!((hw.unit, hw.exponent), (StatUnit::Seconds, -9));
    let mut scratch = Vec::new();
    let mut a = vec![0u64; stats.scalar_count()];
    let mut b = vec![0u64; stats.scalar_count()];
    stats.read_scalars(&mut scratch, &mut a).unwrap();
    stats.read_scalars(&mut scratch, &mut b).unwrap();
    // The vCPU never ran: its exit count stays put.
    let exits = stats.scalar_index("exits").unwrap();
    assert_eq!(a[exits], b[exits]);
    let map = stats.read_map().unwrap();
    assert_eq!(map.len(), stats.scalar_count());
    // A VM fd works too.
    let vm_stats = KvmStats::from_fd(&vm).expect("VM stats");
    println!("VM id: {}", vm_stats.layout().id);
    assert!(vm_stats.scalar_count() > 0);
}
