//! The store bench runs end to end (small) and reports every required field.

#[test]
fn store_bench_reports_every_field() {
    let args = kvfabric_benches::store::StoreArgs {
        blocks: 16,
        disk_blocks: 24,
        clients: 4,
        ..Default::default()
    };
    let v = kvfabric_benches::store::measure(&args).unwrap();
    for k in [
        "ram_ratio",
        "disk_read_ratio",
        "disk_write_ratio",
        "redis_get_gbps",
        "redis_set_gbps",
        "grpc_get_gbps",
        "grpc_put_gbps",
        "redis_get_p50_ms",
        "redis_get_p99_ms",
        "grpc_get_p50_ms",
        "grpc_get_p99_ms",
        "tcp_get_gbps",
        "shm_get_gbps",
        "tcp_get_p50_ms",
        "tcp_get_p99_ms",
        "shm_get_p50_ms",
        "shm_get_p99_ms",
    ] {
        let x = v[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {v}"));
        assert!(x > 0.0, "{k} = {x}");
    }
    check_mooncake(&v);
}

/// Mooncake Store's figures and our ratios to them: all there, positive and
/// finite when it ran; when its venv is not to be had, the reason and null
/// ratios (the bench still reports the rest). A failed Mooncake run fails.
pub fn check_mooncake(v: &serde_json::Value) {
    let mc = &v["mooncake"];
    match mc["status"].as_str() {
        Some("ok") => {
            for k in [
                "mooncake_put_gbps",
                "mooncake_local_get_gbps",
                "mooncake_remote_get_gbps",
                "mooncake_single_get_p50_us",
                "mooncake_single_get_p99_us",
                "put_vs_mooncake",
                "local_get_vs_mooncake",
                "tcp_get_vs_mooncake_remote_get",
            ] {
                let x = v[k].as_f64().unwrap_or(-1.0);
                assert!(x > 0.0 && x.is_finite(), "{k} = {x} in {mc}");
            }
            assert!(
                v["mooncake_single_get_p99_us"].as_f64()
                    >= v["mooncake_single_get_p50_us"].as_f64()
            );
            assert!(
                mc["loopback_connections_checked"].as_u64() > Some(0),
                "{mc}"
            );
        }
        Some("unavailable") => {
            assert!(mc["reason"].as_str().is_some_and(|r| !r.is_empty()), "{mc}");
            assert!(v["put_vs_mooncake"].is_null(), "{v}");
        }
        _ => panic!("the Mooncake run failed: {mc}"),
    }
}

/// The metadata-scale report at small scales: a "policy" section with every
/// order (LIRS too: its reads once missed, "block evicted before its read"),
/// every scale's rate (each run checks its tier stayed full and every read
/// hit) and the ratio.
#[test]
fn metadata_scale_reports_the_policy_section() {
    let args = kvfabric_benches::store::StoreArgs {
        metadata_scale: true,
        metadata_blocks: vec![64, 512],
        metadata_ops: 2000,
        ..Default::default()
    };
    let v = kvfabric_benches::store::measure_metadata(&args).unwrap();
    let p = &v["policy"];
    for name in ["lru", "s3fifo", "lirs"] {
        let runs = p[name]["scales"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} missing in {v}"));
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[1]["resident_blocks"], 512);
        assert!(runs
            .iter()
            .all(|r| r["ops_per_sec"].as_f64().unwrap() > 0.0));
        assert!(p[name]["ratio_largest_to_smallest"].as_f64().unwrap() > 0.0);
    }
    assert!(p["min_ratio"].as_f64().unwrap() > 0.0);
}

/// `--metadata-parts policy` runs the policy section alone (the directory
/// sync section is the slow one).
#[test]
fn metadata_parts_select_the_sections() {
    let args = kvfabric_benches::store::StoreArgs {
        metadata_scale: true,
        metadata_blocks: vec![64, 128],
        metadata_ops: 500,
        metadata_parts: vec![kvfabric_benches::store::MetadataPart::Policy],
        ..Default::default()
    };
    let v = kvfabric_benches::store::measure_metadata(&args).unwrap();
    assert!(v.get("policy").is_some(), "{v}");
    assert!(v.get("directory_sync").is_none(), "{v}");
}

/// The full-size bench, as `kvfabric bench store --json` runs it:
/// `cargo test -p kvfabric-benches --test store_bench -- --ignored --nocapture`.
#[test]
#[ignore = "full-size benchmark (~1 min); run on demand"]
fn store_bench_full_size() {
    let args = kvfabric_benches::store::StoreArgs {
        json: true,
        ..Default::default()
    };
    kvfabric_benches::store::run(&args).unwrap();
}
