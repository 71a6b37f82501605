//! A bench whose Mooncake venv cannot be had says so and reports the rest:
//! `KVFABRIC_MOONCAKE_VENV` naming a directory that does not exist gives
//! `mooncake: {status: "unavailable", reason}`, not a failed bench. (Its own
//! test binary: the variable is set for this process only.)

#[test]
fn a_missing_mooncake_venv_is_reported_not_fatal() {
    let missing = std::env::temp_dir().join("kvfabric-no-such-mooncake-venv");
    assert!(!missing.exists());
    std::env::set_var("KVFABRIC_MOONCAKE_VENV", &missing);
    let args = kvfabric_benches::store::StoreArgs {
        blocks: 8,
        disk_blocks: 8,
        clients: 2,
        ..Default::default()
    };
    let v = kvfabric_benches::store::measure(&args).unwrap();
    let mc = &v["mooncake"];
    assert_eq!(mc["status"], "unavailable", "{mc}");
    let reason = mc["reason"].as_str().unwrap();
    assert!(reason.contains("KVFABRIC_MOONCAKE_VENV"), "{reason}");
    assert!(v["mooncake_put_gbps"].is_null() && v["put_vs_mooncake"].is_null());
    // The rest is measured.
    assert!(v["ram_put_gbps"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["tcp_get_gbps"].as_f64().unwrap() > 0.0, "{v}");
    // Nothing was installed there.
    assert!(!missing.exists());
}
