//! Compiles proto/ with protox (a pure-Rust protobuf compiler: no system protoc) and generates the tonic
//! clients pinboard uses, plus servers so tests can stand up wire-compatible peers where no real one runs.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/cri.proto",
        "proto/containerd/content.proto",
        "proto/containerd/diff.proto",
        "proto/containerd/events.proto",
        "proto/containerd/images.proto",
        "proto/containerd/leases.proto",
        "proto/containerd/snapshots.proto",
        "proto/containerd/types.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        // AuthConfig carries registry passwords: no derived Debug (it would print them). src/backend/cri.rs
        // implements a redacting Debug by hand.
        .skip_debug(["runtime.v1.AuthConfig"])
        .compile_fds(descriptors)?;
    Ok(())
}
