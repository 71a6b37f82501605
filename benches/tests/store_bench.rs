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
