//! Fuzz target `blk`: the properties are those of `ppa_vmm::fuzzing::blk`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ppa_vmm::fuzzing::blk(data));
