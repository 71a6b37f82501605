//! Generates the tonic/prost code and the descriptor set used by gRPC reflection.
//! protoc comes from `protoc-bin-vendored`, so no system protobuf compiler is needed.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/kvfabric/v1/cache.proto",
        "proto/kvfabric/internal/v1/directory.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("kvfabric_descriptor.bin"))
        .compile_with_config(config, &protos, &["proto"])?;
    Ok(())
}
