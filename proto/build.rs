//! Generates the tonic/prost code and the descriptor set used by gRPC reflection.
//! protoc is Debian's `protobuf-compiler` (scripts/install-deps.sh installs it; etcd-client
//! needs it too), found on PATH or through `PROTOC`.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/kvfabric/v1/cache.proto",
        "proto/kvfabric/v1/events.proto",
        "proto/kvfabric/internal/v1/directory.proto",
        "proto/kvfabric/internal/v1/console.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // Block payloads as `bytes::Bytes`: a Get serves slices of the leased
        // block without copying them into messages, and a decoded message
        // shares tonic's receive buffer instead of copying out of it.
        .bytes(".kvfabric.v1.GetResponse.data")
        .bytes(".kvfabric.v1.PutRequest.data")
        .file_descriptor_set_path(out.join("kvfabric_descriptor.bin"))
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
